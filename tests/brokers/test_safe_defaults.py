"""Broker defaults that drop nothing silently, and dropping on purpose, through the whole
daemon against the real RabbitMQ: a message the handler discards (``Message.discard``) is
acked without being written or failed; with no ``on_failure`` and no dead-letter exchange a
failed message is requeued and handled on its redelivery, never thrown away."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.brokers.conftest import AMQP_URL
from tests.brokers.daemons import failed as failed_in
from tests.brokers.daemons import handled as handled_in
from tests.brokers.daemons import run
from tests.e2e.test_pipeline import make_config

pytestmark = pytest.mark.broker


def run_on(short_tmp: Path, rabbit, queue: str, n: int, body: Callable[[int], dict],
           handler: str) -> None:
    """Publish ``n`` JSON bodies (message ids ``m<i>``) and run the daemon ``--until-idle``
    with ``handler`` and a batcher; it must exit 0."""
    import pika

    rabbit.ch.confirm_delivery()
    for i in range(n):
        rabbit.ch.basic_publish("", queue, json.dumps(body(i)).encode(),
                                pika.BasicProperties(message_id=f"m{i}"))
    config = make_config(short_tmp, handler=handler, source="rabbitmq",
                         options={"url": AMQP_URL, "queue": queue},
                         batchers={"default": {"batch_size": 100, "batch_timeout": 0.2}})
    proc = run(config)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_discarded_messages_are_acked_not_written_not_failed(short_tmp: Path, rabbit) -> None:
    queue = rabbit.queue(dlx=True)
    n = 1000
    run_on(short_tmp, rabbit, queue, n, lambda i: {"seq": i, "drop": i % 3 == 0},
           "tests.brokers.handlers:Filters")
    kept = {f"m{i}" for i in range(n) if i % 3}
    handled = handled_in(short_tmp)
    assert set(handled) == kept and max(handled.values()) == 1
    assert failed_in(short_tmp) == set()
    assert rabbit.ready(queue) == 0 and rabbit.take_all(queue) == []   # all acked
    assert rabbit.take_all(f"{queue}.dlq") == []                      # none rejected


def test_default_failure_policy_requeues_and_drops_nothing(short_tmp: Path, rabbit) -> None:
    """No dead-letter exchange, no on_failure: a failed message comes back and is handled
    on its redelivery (BroadwayRabbitMQ's reject_and_requeue), none is thrown away."""
    queue = rabbit.queue()
    n = 500
    run_on(short_tmp, rabbit, queue, n, lambda i: {"seq": i, "flaky": i % 10 == 3},
           "tests.brokers.handlers:Flaky")
    handled = handled_in(short_tmp)
    assert set(handled) == {f"m{i}" for i in range(n)} and max(handled.values()) == 1
    assert failed_in(short_tmp) == {f"m{i}" for i in range(n) if i % 10 == 3}
    assert rabbit.ready(queue) == 0 and rabbit.take_all(queue) == []
