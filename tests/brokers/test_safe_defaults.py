"""Broker defaults that drop nothing silently, and dropping on purpose: a message the
handler discards (``Message.discard``) is acked to the broker without being written or
failed, through the whole daemon against the real RabbitMQ."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.brokers.conftest import AMQP_URL
from tests.brokers.daemons import failed as failed_in
from tests.brokers.daemons import handled as handled_in
from tests.brokers.daemons import run
from tests.e2e.test_pipeline import make_config

pytestmark = pytest.mark.broker


def rabbit_props(i: int):
    import pika

    return pika.BasicProperties(message_id=f"m{i}")


def test_discarded_messages_are_acked_not_written_not_failed(short_tmp: Path, rabbit) -> None:
    queue = rabbit.queue(dlx=True)
    rabbit.ch.confirm_delivery()
    n = 1000
    for i in range(n):
        body = json.dumps({"seq": i, "drop": i % 3 == 0}).encode()
        rabbit.ch.basic_publish("", queue, body, rabbit_props(i))
    config = make_config(short_tmp, handler="tests.brokers.handlers:Filters", source="rabbitmq",
                         options={"url": AMQP_URL, "queue": queue},
                         batchers={"default": {"batch_size": 100, "batch_timeout": 0.2}})
    proc = run(config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kept = {f"m{i}" for i in range(n) if i % 3}
    handled = handled_in(short_tmp)
    assert set(handled) == kept and max(handled.values()) == 1
    assert failed_in(short_tmp) == set()
    assert rabbit.ready(queue) == 0 and rabbit.take_all(queue) == []   # all acked
    assert rabbit.take_all(f"{queue}.dlq") == []                      # none rejected
