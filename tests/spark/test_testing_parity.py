"""``offbroadway.testing`` fails exactly the messages the daemon fails, with the same
reasons, and passes the rest: the same lines through the real daemon (spool → Spark, the
suite's shared Connect server) and through ``test_messages`` with the same config.  The
dataset exists before the run (its ``n`` a BIGINT), so a ``str`` or a ``float`` in ``n``
does not fit it; a ``set`` and an object do not cross the wire at all."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from offbroadway.daemon.config.load import load_config
from offbroadway.daemon.core.outcome import EXIT_FAILED
from offbroadway.testing import test_messages

from tests.api.parity_handlers import Parity
from tests.e2e.test_pipeline import make_config
from tests.spark.test_pipeline_spark import TOKEN_ENV, daemon_env, rows, run, spark_section

pytestmark = pytest.mark.spark


def lines() -> list[dict]:
    kinds = [("ok", 1), ("set", 2), ("object", 3), ("tuple", 4), ("ok", "x"), ("ok", 2.5),
             ("ok", 7), ("ok", 2.0)]
    return [{"seq": i, "kind": k, "n": n} for i, (k, n) in enumerate(kinds * 3)]


def existing_dataset(out: Path) -> None:
    """A dataset as an earlier run left it: ``n`` BIGINT, ``tags`` ARRAY<STRING>."""
    (out / "spark").mkdir(parents=True)
    pq.write_table(pa.table({"seq": pa.array([-1], pa.int64()), "n": pa.array([1], pa.int64()),
                             "tags": pa.array([["x"]], pa.list_(pa.string())),
                             "message_id": ["earlier"],
                             "ingested_at": pa.array([0], pa.timestamp("us", "UTC"))}),
                   out / "spark" / "part-00000-earlier.snappy.parquet")


def test_the_unit_test_fails_what_the_daemon_fails(short_tmp: Path, spark_server) -> None:
    data = lines()
    spool = short_tmp / "spool"
    spool.mkdir()
    (spool / "a.jsonl").write_text("".join(json.dumps(d) + "\n" for d in data))
    out = short_tmp / "dataset"
    existing_dataset(out)
    failed_log = short_tmp / "failed.jsonl"
    config = make_config(short_tmp, handler="tests.api.parity_handlers:Parity",
                         context={"failed_log": str(failed_log)},
                         batchers={"spark": {"batch_size": 5, "batch_timeout": 0.2}})
    config.write_text(config.read_text() + spark_section(
        out, remote=spark_server.remote, token_env=TOKEN_ENV, commit_interval=0.2))

    proc = run(config, daemon_env(spark_server))
    assert proc.returncode == EXIT_FAILED, proc.stderr[-4000:]
    daemon_failed = {r["seq"]: r["status"]
                     for r in map(json.loads, failed_log.read_text().splitlines())}
    daemon_written = sorted(r["seq"] for r in rows(out, "spark") if r["seq"] >= 0)
    # the staged copies of the batches are gone with the daemon (they were left behind)
    assert list((short_tmp / "state" / "spark-staging").rglob("*.parquet")) == []

    loaded = load_config(str(config)).config
    failed_log.unlink()
    # the same config: but the dataset now holds the run's rows too (same schema)
    result = test_messages(Parity(), data, config=loaded,
                           context={"failed_log": str(failed_log)})
    assert result.schema_sources == {"spark": "dataset"}
    unit_failed = {m.data["seq"]: m.status for m in result.failed}
    assert unit_failed == daemon_failed
    assert sorted(m.data["seq"] for m in result.successful) == daemon_written
    assert set(daemon_failed) == {i for i, d in enumerate(data)
                                  if d["kind"] in ("set", "object") or d["n"] in ("x", 2.5)}

    # offbroadway test on the same lines: the same failures, the same rows
    import subprocess

    from tests.conftest import REPO, offbroadway_cmd, test_env

    said = subprocess.run(offbroadway_cmd("test", str(config), str(spool / "done" / "a.jsonl")),
                          cwd=REPO, env=test_env(), capture_output=True, text=True,
                          timeout=120)
    assert said.returncode == EXIT_FAILED, said.stderr[-3000:]
    out = said.stdout.splitlines()
    failed_at = out.index(f"failed ({len(daemon_failed)}):")
    printed = dict(line.strip().split(": ", 1) for line in out[failed_at + 1:])
    assert printed == {f"a.jsonl:{seq + 1}": why for seq, why in daemon_failed.items()}
    start = out.index(f"rows for spark ({len(daemon_written)}):")
    assert sorted(json.loads(line)["seq"] for line in out[start + 1:start + 1 +
                                                             len(daemon_written)]) == \
        daemon_written


DDLS = [
    "seq BIGINT, payload STRING, at TIMESTAMP",
    "a INT NOT NULL, b DOUBLE COMMENT 'the b', c DECIMAL(12, 3), d DATE, e BOOLEAN",
    "`odd name` STRING, t TIMESTAMP_NTZ, s SMALLINT, y TINYINT, f FLOAT, bin BINARY",
    "xs ARRAY<BIGINT>, m MAP<STRING, DOUBLE>, st STRUCT<x: INT, y: ARRAY<STRING>>",
    "l LONG, dec DECIMAL, n NUMERIC(5), i INTEGER, r REAL, ts TIMESTAMP_LTZ",
    "a: int, b: struct<c: string not null>",
]


@pytest.mark.parametrize("ddl", DDLS)
def test_the_ddl_parser_agrees_with_spark(ddl: str, spark) -> None:
    """What the unit tests convert against is what the committer gets from Spark."""
    from offbroadway.stages.spark import spark_schema

    assert spark_schema.ddl_schema(ddl) == spark_schema.ddl_fields_to_arrow(
        spark.createDataFrame([], schema=ddl).schema)


def test_offbroadway_test_prints_the_rows_and_schema_spark_writes(short_tmp: Path,
                                                                  spark_server) -> None:
    """The README's example (config/example.toml, examples/orders.py) on a fixtures file:
    ``offbroadway test`` says which rows and which schema a real run then writes."""
    import re
    import subprocess

    from tests.conftest import REPO, offbroadway_cmd, test_env

    fixtures = short_tmp / "orders.jsonl"
    lines = (REPO / "examples" / "spool" / "orders-0000.jsonl").read_text().splitlines()[:40]
    lines[7] = '{"order": 7, "qty": 1}'            # not an order: fails in handle_message
    lines[9] = "{not json"                         # fails at the source
    fixtures.write_text("\n".join(lines) + "\n")
    (short_tmp / "spool").mkdir()
    text = (REPO / "config" / "example.toml").read_text()
    for old, new in (('path = "var/spool"', f'path = "{short_tmp / "spool"}"'),
                     ('output = "var/orders"', f'output = "{short_tmp / "out"}"\n'
                      f'remote = "{spark_server.remote}"\ntoken_env = "{TOKEN_ENV}"\n'
                      f'commit_interval = 0.2'),
                     ('master = "local[2]"\n', ""),
                     ('listen = "127.0.0.1:9464"', 'listen = ""'),
                     ('dir = "var/run"', f'dir = "{short_tmp / "run"}"'),
                     ('state_dir = "var/state"', f'state_dir = "{short_tmp / "state"}"')):
        assert old in text, old
        text = text.replace(old, new)
    config = short_tmp / "example.toml"
    config.write_text(text)

    said = subprocess.run(offbroadway_cmd("test", str(config), str(fixtures)), cwd=REPO,
                          env=test_env(), capture_output=True, text=True, timeout=120)
    assert said.returncode == EXIT_FAILED, said.stderr[-3000:]
    out = said.stdout.splitlines()
    start = out.index("rows for spark (38):")
    predicted = {r["message_id"]: r for r in map(json.loads, out[start + 1:start + 39])}
    schema = re.search(r"^schema for spark \(inferred\): (.*)$", said.stdout, re.M)
    assert schema, said.stdout

    (short_tmp / "spool" / "orders.jsonl").write_text(fixtures.read_text())
    proc = run(config, daemon_env(spark_server))
    assert proc.returncode == EXIT_FAILED, proc.stderr[-4000:]
    written = {r["message_id"]: {k: v for k, v in r.items() if k != "ingested_at"}
               for r in rows(short_tmp / "out", "spark")}
    assert written == predicted
    verify = subprocess.run(offbroadway_cmd("spark", "verify", str(config)), cwd=REPO,
                            env=daemon_env(spark_server), capture_output=True, text=True,
                            timeout=300)
    assert f"  schema: {schema.group(1)}" in verify.stdout.splitlines(), verify.stdout
