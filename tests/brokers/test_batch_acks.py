"""A batch is acked as soon as its ``handle_batch`` returns, as in Broadway: a slow batch
read in the same wake-up behind it must not hold its acks (nor the broker's prefetch slots
they take).  Checked at the broker: its count of unacknowledged messages."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.brokers.conftest import AMQP_URL
from tests.conftest import REPO, offbroadway_cmd, test_env, wait_until
from tests.e2e.handlers import read_records
from tests.e2e.test_pipeline import make_config

pytestmark = pytest.mark.broker

SLOW = 12.0


def unacked_at_broker(queue: str) -> int | None:
    res = subprocess.run(["rabbitmqctl", "-q", "list_queues", "name",
                          "messages_unacknowledged"], capture_output=True, text=True,
                         timeout=60, check=False)
    for line in res.stdout.splitlines():
        name, _, count = line.partition("\t")
        if name == queue and count.strip().isdigit():
            return int(count)
    return None


def test_a_slow_second_batch_does_not_hold_the_first_ones_acks(short_tmp: Path,
                                                               rabbit) -> None:
    import pika

    queue = rabbit.queue()
    rabbit.ch.confirm_delivery()
    for i in range(4):
        rabbit.ch.basic_publish("", queue, json.dumps({"seq": i, "slow": i >= 2}).encode(),
                                pika.BasicProperties(message_id=f"m{i}"))
    config = make_config(short_tmp, handler="tests.brokers.handlers:SlowBatches",
                         source="rabbitmq", processors=1, context={"batch_slow": SLOW},
                         options={"url": AMQP_URL, "queue": queue},
                         batchers={"default": {"batch_size": 2, "batch_timeout": 0.5}})
    daemon = subprocess.Popen(offbroadway_cmd("run", str(config), "--until-idle"), cwd=REPO,
                              env=test_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        wait_until(lambda: len(read_records(str(short_tmp / "out"), "batch-")) >= 2,
                   timeout=60, interval=0.02, message="the first batch handled")
        returned = time.monotonic()
        assert {r["id"] for r in read_records(str(short_tmp / "out"), "batch-")} == \
            {"m0", "m1"}
        # the second batch sleeps SLOW seconds: the first's two acks are at the broker
        # well before it returns
        wait_until(lambda: unacked_at_broker(queue) == 2, timeout=SLOW / 2, interval=0.2,
                   message="the first batch's 2 messages acked at the broker")
        assert time.monotonic() - returned < SLOW / 2
        _, err = daemon.communicate(timeout=90)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(30)
    assert daemon.returncode == 0, err[-3000:]
    assert rabbit.ready(queue) == 0 and unacked_at_broker(queue) == 0
