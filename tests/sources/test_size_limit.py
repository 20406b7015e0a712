"""``max_message_bytes``: a message over it fails with its size as the reason and is
dead-lettered whole (RabbitMQ's DLX, the Redis dead-letter stream) or pointed at (the
spool line stays in its file, moved to ``done_dir``); the messages after it still flow.
Below the limit, big messages must not stall the pipeline either: frames between stages
are split under the receivers' frame limit.

The spool and Redis are driven in-process first (exact metadata, exact dead letters),
then the whole daemon runs each case against the real spool and RabbitMQ."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from offbroadway.daemon.core.outcome import EXIT_FAILED
from offbroadway.stages.sources import SourceOptionError, get_source
from offbroadway.stages.sources.base import (
    DEFAULT_MAX_MESSAGE_BYTES,
    MAX_MESSAGE_BYTES_LIMIT,
    failure_of,
)

from tests.brokers.conftest import AMQP_URL, REDIS_URL, rabbit, rq, unique  # noqa: F401
from tests.conftest import REPO, offbroadway_cmd, test_env
from tests.e2e.handlers import read_records
from tests.e2e.test_pipeline import make_config

from .conftest import SpoolDirs, drain

MiB = 1024 * 1024


# -- the option --------------------------------------------------------------------------------

@pytest.mark.parametrize("name,options", [
    ("spool", {"path": "/nonexistent"}),
    ("rabbitmq", {"queue": "q"}),
    ("redis", {"stream": "s"}),
])
def test_option_is_validated_by_every_source(name: str, options: dict) -> None:
    try:
        cls = get_source(name)
    except ImportError:
        pytest.skip(f"{name}: client library not installed")
    cls.validate_options({**options, "max_message_bytes": 1000})
    for bad in (0, -1, "16MiB", True, 1.5, MAX_MESSAGE_BYTES_LIMIT + 1):
        with pytest.raises((SourceOptionError, ValueError), match="max_message_bytes"):
            cls.validate_options({**options, "max_message_bytes": bad})


# -- spool, in-process ------------------------------------------------------------------------

def test_spool_fails_oversized_lines_without_reading_them_whole(spool: SpoolDirs) -> None:
    limit = 1000
    big_inside = "x" * 5000                      # within one read: found by its length
    huge = "y" * (3 * MiB)                       # spans reads: passed over as it is read
    lines = [json.dumps({"n": 1}), json.dumps({"big": big_inside}), json.dumps({"n": 3}),
             json.dumps({"huge": huge}), json.dumps({"n": 5}), json.dumps({"last": huge})]
    path = spool.path / "a.jsonl"
    path.write_text("\n".join(lines))            # the oversized last line has no newline
    src = spool.source(max_message_bytes=limit)
    items = drain(src)
    by_line = {it[2]["line"]: (it[1], it[2], it[3], failure_of(it)) for it in items}
    assert sorted(by_line) == [1, 2, 3, 4, 5, 6]
    assert [by_line[n][0] for n in (1, 3, 5)] == [{"n": 1}, {"n": 3}, {"n": 5}]
    raw = path.read_bytes()
    for n in (2, 4, 6):
        data, meta, _, failed = by_line[n]
        size = len(lines[n - 1].encode())
        assert data is None and meta["line_bytes"] == size and "error" not in meta
        assert failed == (f"line of {size} bytes is over max_message_bytes ({limit}); "
                                 f"not delivered to handle_message")
    assert src.stats()["oversized"] == 3
    # the process never held a 3 MiB line: what it keeps for in-flight lines is small
    assert all(len(str(v)) < 2 * limit or not isinstance(v, str)
               for fs in src._files.values() for v in fs.outstanding.values())

    src.ack([by_line[n][2] for n in (1, 3, 5)])
    src.fail([(by_line[n][2], by_line[n][3]) for n in (2, 4, 6)])
    dead = [json.loads(x) for x in spool.dead_letter.read_text().splitlines()]
    assert [d["line"] for d in dead] == [2, 4, 6]
    assert all(d["text"] is None and "over max_message_bytes" in d["reason"] for d in dead)
    # the dead letter says where the line is: its bytes, at its offset, in the moved file
    moved = (spool.done / "a.jsonl").read_bytes()
    assert moved == raw
    for d in dead:
        assert moved[d["offset"]:d["offset"] + d["bytes"]] == lines[d["line"] - 1].encode()
    src.close()


def test_spool_limit_counts_bytes_not_characters(spool: SpoolDirs) -> None:
    wide = "é" * 600                              # 600 characters, 1200 bytes in UTF-8
    spool.write("u.jsonl", [{"w": wide}, {"n": 2}])
    items = drain(spool.source(max_message_bytes=1000))
    assert items[0][1] is None and "over max_message_bytes" in failure_of(items[0])
    assert items[1][1] == {"n": 2}


# -- redis, in-process ------------------------------------------------------------------------

@pytest.mark.broker
def test_redis_fails_oversized_entries_and_dead_letters_them_whole(rq) -> None:  # noqa: F811
    stream = unique("size")
    rq.test_streams.append(stream)
    small = rq.xadd(stream, {"n": "1"}).decode()
    big = rq.xadd(stream, {"blob": "z" * 5000}).decode()
    after = rq.xadd(stream, {"n": "3"}).decode()
    src = get_source("redis")({"url": REDIS_URL, "stream": stream, "group": "g",
                               "max_message_bytes": 1000}, pipeline="t")
    src.open()
    try:
        items = {i[0]: i for i in src.fetch(10)}
        assert list(items) == [small, big, after]
        assert items[small][1] == {"n": "1"} and items[after][1] == {"n": "3"}
        _, data, meta, handle = items[big]
        assert data is None and meta["entry_bytes"] == 5004
        assert "entry of 5004 bytes is over max_message_bytes (1000)" in failure_of(items[big])
        src.ack([items[small][3], items[after][3]])
        src.fail([(handle, failure_of(items[big]))])
        dead = rq.xrange(f"{stream}:dead")
        assert len(dead) == 1 and dead[0][1][b"blob"] == b"z" * 5000
        assert b"over max_message_bytes" in dead[0][1][b"dead_letter.reason"]
        assert rq.xpending(stream, "g")["pending"] == 0
    finally:
        src.close()


# -- the whole daemon -------------------------------------------------------------------------

def run_until_idle(config: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(offbroadway_cmd("run", str(config), "--until-idle"), cwd=REPO,
                          env=test_env(), capture_output=True, text=True, timeout=timeout)


def test_daemon_spool_oversized_line_fails_and_the_rest_flows(short_tmp: Path) -> None:
    spool = short_tmp / "spool"
    spool.mkdir()
    lines = [json.dumps({"seq": i, "route": "default",
                         **({"blob": "x" * (3 * MiB)} if i == 5 else {})}) for i in range(40)]
    (spool / "a.jsonl").write_text("\n".join(lines) + "\n")
    config = make_config(short_tmp, options={"path": str(spool), "max_message_bytes": MiB},
                         batchers={"default": {"batch_size": 10, "batch_timeout": 0.2}})
    proc = run_until_idle(config)
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]   # finished, some failed
    out = str(short_tmp / "out")
    handled = Counter(r["id"] for r in read_records(out, "batch-"))
    failed = {r["id"]: r["reason"] for r in read_records(out, "failed-")}
    assert set(handled) == {f"a.jsonl:{i + 1}" for i in range(40) if i != 5}
    assert list(failed) == ["a.jsonl:6"]
    assert failed["a.jsonl:6"].startswith(f"line of {len(lines[5])} bytes is over "
                                          f"max_message_bytes ({MiB})")
    dead = (short_tmp / "state" / "spool" / "dead-letter.jsonl").read_text().splitlines()
    assert len(dead) == 1 and json.loads(dead[0])["bytes"] == len(lines[5])
    assert "39 messages acked, 1 failed" in proc.stdout


def test_daemon_big_messages_under_the_limit_do_not_stall(short_tmp: Path) -> None:
    """Six 12 MiB lines: a frame of them (to a processor, a batcher, back to the producer,
    or as one batch) would be over the 64 MiB frame limit and dropped; split, they flow."""
    spool = short_tmp / "spool"
    spool.mkdir()
    big = "x" * (12 * MiB)
    (spool / "a.jsonl").write_text("".join(
        json.dumps({"seq": i, "route": "default", **({"blob": big} if 1 <= i <= 6 else {})})
        + "\n" for i in range(10)))
    config = make_config(short_tmp, options={"path": str(spool)},
                         batchers={"default": {"batch_size": 10, "batch_timeout": 0.5}})
    proc = run_until_idle(config, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "malformed" not in proc.stderr
    handled = Counter(r["id"] for r in read_records(str(short_tmp / "out"), "batch-"))
    assert set(handled) == {f"a.jsonl:{i + 1}" for i in range(10)}
    assert not read_records(str(short_tmp / "out"), "failed-")


@pytest.mark.broker
def test_daemon_rabbitmq_oversized_message_is_dead_lettered_whole(short_tmp: Path,
                                                                  rabbit) -> None:  # noqa: F811
    import pika

    queue = rabbit.queue(dlx=True)
    rabbit.ch.confirm_delivery()
    big = json.dumps({"seq": 3, "blob": "b" * (DEFAULT_MAX_MESSAGE_BYTES + 1)}).encode()
    for i in range(20):
        body = big if i == 3 else json.dumps({"seq": i}).encode()
        rabbit.ch.basic_publish("", queue, body, pika.BasicProperties(message_id=f"m{i}"))
    config = make_config(short_tmp, handler="tests.brokers.handlers:JsonBody",
                         source="rabbitmq", options={"url": AMQP_URL, "queue": queue},
                         batchers={"default": {"batch_size": 5, "batch_timeout": 0.2}})
    proc = run_until_idle(config)
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]   # finished, some failed
    out = str(short_tmp / "out")
    handled = Counter(r["id"] for r in read_records(out, "batch-"))
    failed = {r["id"]: r["reason"] for r in read_records(out, "failed-")}
    assert set(handled) == {f"m{i}" for i in range(20) if i != 3}
    assert list(failed) == ["m3"] and "over max_message_bytes" in failed["m3"]
    assert rabbit.ready(queue) == 0
    method, props, body = rabbit.ch.basic_get(f"{queue}.dlq", auto_ack=True)
    assert method is not None and props.message_id == "m3" and body == big
