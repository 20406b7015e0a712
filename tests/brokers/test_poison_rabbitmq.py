"""A poison message from RabbitMQ: it segfaults the processor ``max_crashes`` times, then
lands in the queue's dead-letter queue (the broker's own DLX, through ``source.fail``),
while every good message is handled and acked and the queue ends empty."""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from pathlib import Path

import pika
import pytest
from offbroadway.daemon.core.outcome import EXIT_FAILED

from tests.brokers.conftest import AMQP_URL
from tests.conftest import REPO, offbroadway_cmd, test_env
from tests.e2e.handlers import read_records
from tests.e2e.test_pipeline import make_config
from tests.e2e.test_poison import GOOD, MAX_CRASHES, POISON_AT

pytestmark = pytest.mark.broker


def test_a_poison_message_lands_in_the_dead_letter_queue(short_tmp: Path, rabbit) -> None:
    queue = rabbit.queue(dlx=True)
    rabbit.ch.confirm_delivery()
    ids = [f"m{i}" for i in range(GOOD)]
    bodies = [json.dumps({"seq": i}) for i in range(GOOD)]
    ids.insert(POISON_AT, "the-poison")
    bodies.insert(POISON_AT, json.dumps({"seq": "poison", "poison": "segv"}))
    for mid, body in zip(ids, bodies):
        rabbit.ch.basic_publish("", queue, body.encode(), pika.BasicProperties(message_id=mid))
    config = make_config(short_tmp, handler="tests.e2e.poison_handlers:Poisoned",
                         source="rabbitmq", options={"url": AMQP_URL, "queue": queue})
    config.write_text(config.read_text().replace(
        "[processors.default]\n", f"[processors.default]\nmax_crashes = {MAX_CRASHES}\n"))
    proc = subprocess.run(offbroadway_cmd("run", str(config), "--until-idle"), cwd=REPO,
                          env=test_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]   # finished, some failed
    out = str(short_tmp / "out")
    counts = Counter(r["id"] for r in read_records(out, "handled-"))
    assert set(counts) == set(ids) - {"the-poison"}
    # duplicates only among what the crashes' requeues handed back (each logs its count)
    requeued = sum(int(k) for k in re.findall(r"requeued (\d+) in-flight messages",
                                              proc.stderr))
    assert sum(c - 1 for c in counts.values()) <= requeued
    assert [d["id"] for d in read_records(out, "poison-deliveries")] == \
        ["the-poison"] * MAX_CRASHES
    failed = read_records(out, "failed-")
    assert [f["id"] for f in failed] == ["the-poison"]
    assert f"killed a processor {MAX_CRASHES} times" in failed[0]["reason"]
    assert "SIGSEGV" in failed[0]["reason"]
    assert "message the-poison is poison" in proc.stderr
    assert rabbit.ready(queue) == 0
    assert rabbit.take_all(queue) == []
    assert rabbit.take_all(f"{queue}.dlq") == ["the-poison"]
