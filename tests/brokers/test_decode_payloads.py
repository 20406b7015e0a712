"""``decode = "json"`` on the broker sources, through the whole daemon: the handler gets the
parsed value (the e2e Recorder, which reads ``message.data`` as a dict, with no decoding of
its own), and a payload that is not JSON fails with json's reason and is dead-lettered whole
by the source's failure policy, never dropped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from offbroadway.daemon.core.outcome import EXIT_FAILED

from tests.brokers.conftest import AMQP_URL, REDIS_URL, unique
from tests.brokers.daemons import failed as failed_in
from tests.brokers.daemons import handled as handled_in
from tests.brokers.daemons import run
from tests.brokers.natsutil import NATS_URL
from tests.e2e.handlers import read_records
from tests.e2e.test_pipeline import make_config

pytestmark = pytest.mark.broker
N = 300
BAD = b"{not json"
BATCHERS = {"default": {"batch_size": 50, "batch_timeout": 0.2}}


def bodies() -> list[bytes]:
    """N JSON bodies, every 50th asking the handler to fail it, and one that is not JSON
    (index N) at the end."""
    return [json.dumps({"seq": i, "fail": i % 50 == 7}).encode() for i in range(N)] + [BAD]


def reasons(tmp: Path) -> dict[str, str]:
    return {r["id"]: r["reason"] for r in read_records(str(tmp / "out"), "failed-")}


def not_json_reason(raw: bytes, what: str) -> str:
    try:
        json.loads(raw)
    except ValueError as exc:
        return f"{what} is not valid JSON: {exc}"
    raise AssertionError("it is JSON")


def check(tmp: Path, ids: list[str], bad_reason: str, also_failed: frozenset = frozenset()
          ) -> None:
    """Every good message handled once as a dict, the failed ones and the bad one failed."""
    handled, failed = handled_in(tmp), failed_in(tmp)
    asked = {ids[i] for i in range(N) if i % 50 == 7}
    assert failed == asked | {ids[N]} | also_failed
    assert set(handled) == set(ids[:N]) - asked and max(handled.values()) == 1
    assert reasons(tmp)[ids[N]] == bad_reason


def test_rabbitmq_decode_json(short_tmp: Path, rabbit) -> None:
    import pika

    queue = rabbit.queue(dlx=True)
    rabbit.ch.confirm_delivery()
    ids = [f"m{i}" for i in range(N + 1)]
    for mid, body in zip(ids, bodies()):
        rabbit.ch.basic_publish("", queue, body, pika.BasicProperties(message_id=mid))
    config = make_config(short_tmp, source="rabbitmq", batchers=BATCHERS,
                         options={"url": AMQP_URL, "queue": queue, "decode": "json",
                                  # the "fail" ones fail on every delivery: the default
                                  # would requeue them (the bad body is rejected anyway)
                                  "on_failure": "reject"})
    proc = run(config)
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]   # finished, some failed
    check(short_tmp, ids, not_json_reason(BAD, "body"))
    assert rabbit.ready(queue) == 0
    dead = []
    while True:     # the dead letters, bodies intact
        method, props, body = rabbit.ch.basic_get(f"{queue}.dlq", auto_ack=True)
        if method is None:
            break
        dead.append((props.message_id, body))
    assert dict(dead)[ids[N]] == BAD and len(dead) == N // 50 + 1


def test_nats_decode_json(short_tmp: Path, jet: Any) -> None:
    stream = jet.stream(dead_letter=True)
    ids = jet.publish(stream, bodies())
    config = make_config(short_tmp, source="nats", batchers=BATCHERS,
                         options={"url": NATS_URL, "stream": stream, "decode": "json",
                                  "max_deliver": 1,
                                  "dead_letter_subject": f"{stream}-dead.failed"})
    proc = run(config)
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]   # finished, some failed
    check(short_tmp, ids, not_json_reason(BAD, "body"))
    dead = {m.headers["Nats-Msg-Id"]: m.data for m in jet.messages(f"{stream}-dead")}
    assert dead[ids[N]] == BAD and len(dead) == N // 50 + 1


def test_redis_decode_json_field(short_tmp: Path, rq: Any) -> None:
    stream = unique("s")
    rq.test_streams.append(stream)
    pipe = rq.pipeline(transaction=False)
    for body in bodies():
        pipe.xadd(stream, {"data": body, "source": "test"})
    pipe.xadd(stream, {"other": "no data field"})
    ids = [i.decode() if isinstance(i, bytes) else i for i in pipe.execute()]
    config = make_config(short_tmp, source="redis", batchers=BATCHERS,
                         options={"url": REDIS_URL, "stream": stream, "decode": "json"})
    proc = run(config)
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]   # finished, some failed
    missing = ids.pop()
    assert reasons(short_tmp)[missing] == \
        "entry has no field 'data' to decode (decode = \"json\")"
    check(short_tmp, ids, not_json_reason(BAD, "field 'data'"), frozenset({missing}))
    dead = {e[1][b"dead_letter.id"].decode(): e[1] for e in rq.xrange(f"{stream}:dead")}
    assert dead[ids[N]][b"data"] == BAD and dead[missing][b"other"] == b"no data field"
    assert len(dead) == N // 50 + 2
