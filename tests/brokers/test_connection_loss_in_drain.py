"""The RabbitMQ connection lost while ``--until-idle`` drains: the broker takes back what
the source held (a slow last batch's messages among them, their acks not sent), and the
drained source would leave them in the queue.  The run must not end there with exit 0:
it runs again, and ends with every message acked once, the queue empty, and the summary
saying so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.brokers.conftest import AMQP_URL, TcpProxy
from tests.brokers.test_counts_agree import status
from tests.brokers.test_until_idle_failures import summary
from tests.conftest import wait_until
from tests.e2e.test_pipeline import make_config, run_until_idle_while

pytestmark = pytest.mark.broker


def test_a_connection_lost_in_the_drain_runs_again_until_every_message_is_acked(
        short_tmp: Path, rabbit) -> None:
    import pika

    n = 400
    queue = rabbit.queue()
    rabbit.ch.confirm_delivery()
    for i in range(n):
        body = {"seq": i, "slow": i == n - 1}
        rabbit.ch.basic_publish("", queue, json.dumps(body).encode(),
                                pika.BasicProperties(message_id=f"m{i}"))
    proxy = TcpProxy(5672)
    url = AMQP_URL.replace(":5672/", f":{proxy.port}/")
    config = make_config(short_tmp, handler="tests.brokers.handlers:SlowBatches",
                         source="rabbitmq", context={"batch_slow": 4.0},
                         options={"url": url, "queue": queue, "backoff_min": 0.2},
                         batchers={"default": {"batch_size": 50, "batch_timeout": 0.2}})

    def drop_the_connection_in_the_drain() -> None:
        # the last batch is in its slow handle_batch: the source is exhausted, the drain on
        wait_until(lambda: status(config).get("draining"), timeout=60, interval=0.05,
                   message="the drain begun")
        proxy.down()
        proxy.up()

    try:
        code, out, err = run_until_idle_while(config, drop_the_connection_in_the_drain,
                                              timeout=120)
    finally:
        proxy.down()
    assert "lost" in err and "messages went back to the source during the drain" in err, \
        err[-3000:]
    assert code == 0, (out[-1000:], err[-3000:])
    line = summary(out)
    assert line.startswith(f"e2e: {n} messages acked, 0 failed"), (line, err[-3000:])
    assert rabbit.ready(queue) == 0
