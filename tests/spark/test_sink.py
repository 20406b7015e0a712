"""SparkSink against a real local Spark Connect server (shared across these tests)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from offbroadway import Message

from tests.conftest import test_env

pytestmark = pytest.mark.spark

HERE = Path(__file__).resolve().parent


def _sink(**kw):
    from offbroadway.stages.spark.spark_sink import SparkSink

    return SparkSink(**kw)


def _out(tmp_path: Path) -> str:
    return str(tmp_path / f"out-{uuid.uuid4().hex[:6]}")


def test_round_trip_rows_equal_input(spark, sink_env, tmp_path):
    out = _out(tmp_path)
    beats: list[float] = []
    sink = _sink(output=out, writer_id="batch_processor_spark_0",
                 on_wait=lambda: beats.append(time.monotonic()))
    sent = {f"m-{i}": {"seq": i, "payload": f"{i:0100d}", "score": i / 4, "ok": i % 2 == 0}
            for i in range(1000)}
    msgs = [Message(mid, data) for mid, data in sent.items()]
    t0 = time.time()
    sink.write("spark", msgs)
    assert [m.status for m in msgs if m.status is not None] == []
    assert sink.stats["rows"] == 1000

    df = spark.read.parquet(f"{out}/spark")
    assert set(df.columns) == {"seq", "payload", "score", "ok", "message_id", "ingested_at"}
    rows = df.collect()
    assert len(rows) == 1000
    got = {r.message_id: {"seq": r.seq, "payload": r.payload, "score": r.score, "ok": r.ok}
           for r in rows}
    assert got == sent
    # Spark Connect hands timestamps back naive, in the session's time zone: read them there
    # (a naive value must not pass unchecked), and every row was stamped during the write
    from zoneinfo import ZoneInfo

    zone = ZoneInfo(spark.conf.get("spark.sql.session.timeZone"))
    t1 = time.time()
    stamps = [(r.ingested_at if r.ingested_at.tzinfo else r.ingested_at.replace(tzinfo=zone))
              .timestamp() for r in rows]
    assert all(t0 - 2 <= t <= t1 + 2 for t in stamps), (t0, min(stamps), max(stamps), t1)
    # Spark wrote the dataset itself (no staging directory in it); the staged file the
    # sink handed Spark is gone
    assert not list((Path(out) / "spark").glob("_staging*"))
    assert list((Path(out) / "spark").glob("part-*.parquet"))
    assert not list(Path(sink.staging, "spark").glob("*.parquet"))
    # registrable as a table, as a Spark user would
    name = f"t_{uuid.uuid4().hex[:8]}"
    spark.catalog.createTable(name, path=f"{out}/spark", source="parquet")
    assert spark.table(name).count() == 1000
    spark.sql(f"DROP TABLE {name}")
    sink.close()


def test_explicit_ddl_schema_and_partitions(spark, sink_env, tmp_path):
    out = _out(tmp_path)
    sink = _sink(output=out, writer_id="w0", partition_by=["region"],
                 schema="seq INT, payload STRING, at TIMESTAMP, amount DECIMAL(10,2), "
                        "region STRING NOT NULL")
    msgs = [Message(f"d-{i}", {"seq": i, "payload": "x", "at": "2024-05-01T12:00:00Z",
                               "amount": 1.25, "region": "eu" if i % 2 else "us"})
            for i in range(20)]
    msgs.append(Message("d-missing-optional", {"seq": 99, "region": "eu"}))
    sink.write("orders", msgs)
    assert [m.status for m in msgs] == [None] * 21

    df = spark.read.parquet(f"{out}/orders")
    types = dict(df.dtypes)
    assert types["seq"] == "int"
    assert types["at"] == "timestamp"
    assert types["amount"] == "decimal(10,2)"
    assert types["message_id"] == "string" and types["ingested_at"] == "timestamp"
    assert df.count() == 21
    assert sorted(r.region for r in df.select("region").distinct().collect()) == ["eu", "us"]
    row = df.where("message_id = 'd-3'").collect()[0]
    assert (row.seq, row.payload, str(row.amount), row.at.isoformat()) == \
        (3, "x", "1.25", "2024-05-01T12:00:00")
    opt = df.where("message_id = 'd-missing-optional'").collect()[0]
    assert opt.payload is None and opt.at is None
    assert list((Path(out) / "orders" / "region=eu").glob("part-*.parquet"))
    sink.close()


def test_rows_breaking_the_schema_fail_alone(spark, sink_env, tmp_path):
    out = _out(tmp_path)
    sink = _sink(output=out, writer_id="w0", schema="seq BIGINT NOT NULL, payload STRING")
    good = [Message(f"g-{i}", {"seq": i, "payload": "ok"}) for i in range(50)]
    bad = {
        "b-type": {"seq": "not a number", "payload": "x"},
        "b-trunc": {"seq": 1.5, "payload": "x"},
        "b-null": {"payload": "x"},
        "b-extra": {"seq": 1, "payload": "x", "surprise": True},
        "b-reserved": {"seq": 1, "message_id": "forged"},
        "b-notmap": ["seq", 1],
        "b-payload-type": {"seq": 2, "payload": 12},
    }
    msgs = good[:25] + [Message(k, v) for k, v in bad.items()] + good[25:]
    sink.write("spark", msgs)

    status = {m.id: m.status for m in msgs}
    assert all(status[m.id] is None for m in good)
    for key in bad:
        assert status[key] and status[key].startswith("spark: "), (key, status[key])
    assert "seq" in status["b-type"] and "payload" in status["b-payload-type"]
    assert "NOT NULL" in status["b-null"]
    assert "surprise" in status["b-extra"]
    assert "reserved" in status["b-reserved"]
    assert "mapping" in status["b-notmap"]
    df = spark.read.parquet(f"{out}/spark")
    assert sorted(r.message_id for r in df.select("message_id").collect()) == \
        sorted(m.id for m in good)

    # Inferred schema: the first batch fixes the types; a later misfit fails alone.
    sink2 = _sink(output=out, writer_id="w1")
    first = [Message(f"i-{i}", {"seq": i, "name": "a"}) for i in range(10)]
    sink2.write("inferred", first)
    assert [m.status for m in first] == [None] * 10
    later = [Message("i-10", {"seq": 10, "name": "b"}), Message("i-bad", {"seq": "x"})]
    sink2.write("inferred", later)
    assert later[0].status is None and "seq" in (later[1].status or "")
    assert spark.read.parquet(f"{out}/inferred").count() == 11

    # A DDL Spark cannot parse fails every message with the parser's reason, fast.
    sink3 = _sink(output=out, writer_id="w2", schema="seq INTT")
    for _ in range(2):
        ms = [Message("x", {"seq": 1})]
        sink3.write("broken", ms)
        assert "not valid DDL" in (ms[0].status or "")
    assert not (Path(out) / "broken").exists()
    for s in (sink, sink2, sink3):
        s.close()


def test_json_format(spark, sink_env, tmp_path):
    out = _out(tmp_path)
    sink = _sink(output=out, writer_id="w0", format="json")
    msgs = [Message(f"j-{i}", {"seq": i}) for i in range(10)]
    sink.write("spark", msgs)
    assert [m.status for m in msgs] == [None] * 10
    assert spark.read.json(f"{out}/spark").count() == 10
    sink.close()


# long: not in the default run (pytest -m slow)
@pytest.mark.slow
def test_two_writer_processes_lose_and_duplicate_nothing(spark, spark_server, tmp_path):
    """Two processes committing into the same dataset at once (the committer serializes
    its own commits; this shows the staging-and-rename scheme needs no such luck: with
    both jobs writing into the dataset directory itself, 500 of 142,000 rows vanished)."""
    out = _out(tmp_path)
    env = {**test_env(), **spark_server.bp_env}
    seconds = 20
    procs = [subprocess.Popen([sys.executable, str(HERE / "writer_proc.py"), out, "spark",
                               f"batch_processor_spark_{i}", str(seconds), "500"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    results = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=seconds + 180)
        assert p.returncode == 0, stderr[-3000:]
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    # they really wrote at the same time, many times each
    overlap = min(r["last"] for r in results) - max(r["first"] for r in results)
    assert overlap > seconds / 2, results
    assert all(r["batches"] >= 5 for r in results), results
    assert all(r["failed"] == [] for r in results), [r["failed"][:5] for r in results]

    sent = {f"{r['writer']}-{i}" for r in results for i in range(r["rows"])}
    df = spark.read.parquet(f"{out}/spark")
    stats = df.selectExpr("count(*) AS n", "count(DISTINCT message_id) AS d").collect()[0]
    assert stats.n == stats.d == len(sent), (stats, len(sent))
    got = {r.message_id for r in df.select("message_id").collect()}
    assert got == sent
    assert "writer" not in df.columns


def _dead_port() -> int:
    """A port where nothing listens (bound and released: a refusing endpoint)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.filterwarnings("ignore:.*RETRIES_EXCEEDED")
def test_a_stop_request_abandons_the_retries_and_fails_nothing(tmp_path):
    """Regression (bench/chaos.py): a batch processor told to stop while Spark is down kept
    retrying until SIGKILL.  Now the retry loop gives up at the next back-off and marks
    nothing failed: the messages stay unacked, to be delivered again."""
    from offbroadway.stages.spark.spark_sink import WriteAbandoned

    out = tmp_path / "out"
    stop = {"now": False}
    sink = _sink(remote=f"sc://127.0.0.1:{_dead_port()}", output=str(out), writer_id="w0",
                 write_retry_seconds=600, should_stop=lambda: stop["now"],
                 on_wait=lambda: stop.update(now=sink.stats["retries"] >= 1))
    msgs = [Message(f"m-{i}", {"seq": i}) for i in range(10)]
    t0 = time.monotonic()
    with pytest.raises(WriteAbandoned):
        sink.write("spark", msgs)
    assert time.monotonic() - t0 < 300, "kept retrying toward the 600 s bound"
    assert [m.status for m in msgs] == [None] * 10, "abandoned messages must not be failed"
    assert sink.stats["failed_rows"] == 0 and sink.stats["rows"] == 0
    assert not out.exists()
    sink.close()


@pytest.mark.filterwarnings("ignore:.*RETRIES_EXCEEDED")
def test_spark_down_retries_within_bound_then_fails_everything(tmp_path):
    out = tmp_path / "out"
    beats: list[float] = []
    sink = _sink(remote=f"sc://127.0.0.1:{_dead_port()}", output=str(out), writer_id="w0",
                 write_retry_seconds=3, on_wait=lambda: beats.append(time.monotonic()))
    msgs = [Message(f"m-{i}", {"seq": i}) for i in range(10)]
    t0 = time.monotonic()
    sink.write("spark", msgs)
    took = time.monotonic() - t0
    reasons = {m.status for m in msgs}
    assert len(reasons) == 1
    reason = reasons.pop()
    assert reason and reason.startswith("spark: write failed after"), reason
    assert "retry bound 3 s" in reason
    assert sink.stats["retries"] >= 1 and sink.stats["rows"] == 0
    assert 3 <= took < 30, took
    assert beats, "on_wait (the heartbeat) was not called while retrying"
    assert not out.exists()
    sink.close()


def test_ids_present_finds_exactly_the_ids_the_dataset_holds(spark, sink_env, tmp_path):
    """The lookup of redelivered messages: none before the dataset exists, then exactly
    the ids written (once each, whatever the probe repeats), none of the others."""
    import pyarrow as pa

    out = _out(tmp_path)
    sink = _sink(output=out, writer_id="committer_spark")
    probe = pa.array([f"m-{i}" for i in range(0, 3000, 7)] + ["m-7", "nope"])
    assert sink.ids_present("spark", probe).to_pylist() == []
    sink.write("spark", [Message(f"m-{i}", {"seq": i}) for i in range(1000)])
    found = sorted(sink.ids_present("spark", probe).to_pylist())
    assert found == sorted(f"m-{i}" for i in range(0, 1000, 7))
    sink.close()
