"""The whole daemon against the real RabbitMQ and Redis: 10,000 messages published, the
pipeline run ``--until-idle``, every message handled and acked, the broker left empty, and
exactly the failed messages in the dead-letter target."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from offbroadway.daemon.core.outcome import EXIT_FAILED

from tests.brokers.conftest import AMQP_URL, REDIS_URL, unique
from tests.brokers.daemons import configs_for, run, side_by_side
from tests.brokers.daemons import failed as failed_in
from tests.brokers.daemons import handled as handled_in
from tests.conftest import wait_until
from tests.e2e.test_pipeline import make_config

pytestmark = pytest.mark.broker
N = 10_000


def test_rabbitmq_pipeline_acks_everything_and_dead_letters_exactly_the_failed(
        short_tmp: Path, rabbit) -> None:
    queue = rabbit.queue(dlx=True)
    rabbit.ch.confirm_delivery()
    for i in range(N):
        # every 100th message asks the handler to fail it
        body = json.dumps({"seq": i, "fail": i % 100 == 7}).encode()
        rabbit.ch.basic_publish("", queue, body, rabbit_props(i))
    # on_failure = "reject": these fail on every delivery, the default would requeue them
    config = make_config(short_tmp, handler="tests.brokers.handlers:JsonBody", source="rabbitmq",
                         producers=2, options={"url": AMQP_URL, "queue": queue,
                                               "on_failure": "reject"},
                         batchers={"default": {"batch_size": 200, "batch_timeout": 0.2}})
    proc = run(config)
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]   # finished, some failed
    handled, failed = handled_in(short_tmp), failed_in(short_tmp)
    expected_failed = {f"m{i}" for i in range(N) if i % 100 == 7}
    assert failed == expected_failed
    assert set(handled) == {f"m{i}" for i in range(N)} - expected_failed
    assert max(handled.values()) == 1
    assert rabbit.ready(queue) == 0
    assert sorted(rabbit.take_all(queue)) == []          # nothing unacked came back either
    assert sorted(rabbit.take_all(f"{queue}.dlq")) == sorted(expected_failed)


def rabbit_props(i: int):
    import pika

    return pika.BasicProperties(message_id=f"m{i}", content_type="application/json")


def test_redis_pipeline_acks_everything_and_dead_letters_exactly_the_failed(
        short_tmp: Path, rq) -> None:
    stream = unique("s")
    pipe = rq.pipeline(transaction=False)
    for i in range(N):
        pipe.xadd(stream, {"seq": str(i), "fail": "1" if i % 100 == 7 else ""})
    ids = [i.decode() if isinstance(i, bytes) else i for i in pipe.execute()]   # in seq order
    entry_ids = set(ids)
    config = make_config(short_tmp, handler="tests.brokers.handlers:FieldMap", source="redis",
                         options={"url": REDIS_URL, "stream": stream, "group": "pipeline"},
                         batchers={"default": {"batch_size": 200, "batch_timeout": 0.2}})
    try:
        proc = run(config)
        assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]   # finished, some failed
        handled, failed = handled_in(short_tmp), failed_in(short_tmp)
        expected_failed = {e for seq, e in enumerate(ids) if seq % 100 == 7}
        assert failed == expected_failed
        assert set(handled) == entry_ids - expected_failed
        assert max(handled.values()) == 1
        assert rq.xpending(stream, "pipeline")["pending"] == 0
        dead = rq.xrange(f"{stream}:dead")
        assert len(dead) == len(expected_failed)
    finally:
        rq.delete(stream, f"{stream}:dead")


def test_two_daemons_on_one_queue_share_the_work_without_doubles(short_tmp: Path,
                                                                  rabbit) -> None:
    queue = rabbit.queue()
    n = 4000
    configs = configs_for(short_tmp, handler="tests.brokers.handlers:JsonBody",
                          source="rabbitmq", context={"slow": 0.0005},
                          options={"url": AMQP_URL, "queue": queue},
                          batchers={"default": {"batch_size": 100, "batch_timeout": 0.2}})
    with side_by_side(configs) as side:
        for i in range(n):
            rabbit.ch.basic_publish("", queue, json.dumps({"seq": i}).encode(), rabbit_props(i))

        def handled() -> list[Counter]:
            return [handled_in(t) for t in side.dirs]

        wait_until(lambda: sum(len(c) for c in handled()) >= n, timeout=120,
                   message="every message handled by one daemon or the other")
    codes = side.codes
    assert codes == [0, 0]
    a, b = handled()
    assert set(a) | set(b) == {f"m{i}" for i in range(n)}
    assert not set(a) & set(b), "a message was handled by both daemons"
    assert len(a) > n // 10 and len(b) > n // 10, (len(a), len(b))
    assert rabbit.ready(queue) == 0
