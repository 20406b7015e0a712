"""Dead letters of RabbitMQ, seen and replayed: the source rejects failures to the queue's
dead-letter exchange, ``offbroadway dead-letters`` lists the dead-letter queue and, once the
handler is fixed, moves them back to the queue they came from; every order is written
exactly once, and a second replay finds nothing to do."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from offbroadway.daemon.core.outcome import EXIT_FAILED

from tests.brokers.conftest import AMQP_URL, Rabbit, pika
from tests.brokers.daemons import run
from tests.e2e.replay_handlers import written
from tests.e2e.test_pipeline import make_config
from tests.e2e.test_replay_spool import dead_letters

pytestmark = pytest.mark.broker

N = 200
NO_SKU = set(range(3, N, 10))     # 20 orders without a sku


def test_rejected_orders_replayed_from_the_dead_letter_queue_once(short_tmp: Path,
                                                                  rabbit: Rabbit) -> None:
    queue = rabbit.queue(dlx=True)
    dlq = f"{queue}.dlq"
    for i in range(N):
        order = {"seq": i, **({} if i in NO_SKU else {"sku": f"s{i}"})}
        rabbit.ch.basic_publish("", queue, json.dumps(order).encode(),
                                pika.BasicProperties(message_id=f"order-{i}",
                                                     content_type="application/json"))
    config = make_config(short_tmp, source="rabbitmq", handler="tests.e2e.replay_handlers:Picky",
                         options={"url": AMQP_URL, "queue": queue, "on_failure": "reject",
                                  "dead_letter_queue": dlq},
                         batchers={"default": {"batch_size": 20, "batch_timeout": 0.2}})
    out = str(short_tmp / "out")
    first = run(config)
    assert first.returncode == EXIT_FAILED, first.stderr[-3000:]   # the run says some failed
    assert Counter(written(out)) == Counter(set(range(N)) - NO_SKU)
    assert rabbit.ready(dlq) == len(NO_SKU)

    listed = dead_letters(config)
    assert listed.returncode == 0, listed.stderr
    assert f"{len(NO_SKU)} dead letters in queue '{dlq}' at amqp://guest:***@" in listed.stdout, \
        listed.stdout
    assert f"{len(NO_SKU):>7}  rejected" in listed.stdout, listed.stdout
    assert rabbit.ready(dlq) == len(NO_SKU), "listing leaves the dead letters where they are"
    shown = dead_letters(config, "show", "--limit", "2")
    assert f"queue {queue}, message_id order-3  reason: rejected" in shown.stdout, shown.stdout

    config.write_text(config.read_text().replace("context = {", "context = { fixed = true,"))
    replayed = dead_letters(config, "replay")
    assert replayed.returncode == 0, replayed.stderr
    assert f"replayed {len(NO_SKU)} to queue '{queue}'" in replayed.stdout, replayed.stdout
    assert rabbit.ready(dlq) == 0 and rabbit.ready(queue) == len(NO_SKU)
    second = run(config)
    assert second.returncode == 0, second.stderr[-3000:]
    assert Counter(written(out)) == Counter(range(N)), "every order written exactly once"

    again = dead_letters(config, "replay")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"nothing to replay: no dead letters in queue '{dlq}'"), \
        again.stdout
    third = run(config)
    assert third.returncode == 0, third.stderr[-3000:]
    assert Counter(written(out)) == Counter(range(N))
    assert rabbit.ready(queue) == 0 and rabbit.ready(dlq) == 0
