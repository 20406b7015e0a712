"""One daemon, two producers on one RabbitMQ queue: a message that failed on one producer
and then went through, or failed for good, on the other is counted once, as what it
became, on every surface (the summary, ``status --json``, ``/metrics``), and the broker
holds what the books say.

Half of the messages carry an AMQP ``message_id`` and half do not (their body stands for
them), so both kinds of identity are reconciled between the producers' processes.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.brokers.conftest import AMQP_URL
from tests.brokers.test_counts_agree import (
    kill_when_running,
    metric,
    settle_then_stop,
    status,
)
from tests.brokers.test_until_idle_failures import failed_deliveries, run_until_idle, summary
from tests.conftest import REPO, free_port, offbroadway_cmd, test_env, wait_until
from tests.e2e.test_pipeline import make_config

pytestmark = pytest.mark.broker


def publish(rabbit, queue: str, bodies: list[dict], first: int = 0) -> None:
    """Every other message with a ``message_id``, the others known by their body alone."""
    import pika

    rabbit.ch.confirm_delivery()
    for i, body in enumerate(bodies, first):
        props = pika.BasicProperties(message_id=f"m{i}") if i % 2 else None
        rabbit.ch.basic_publish("", queue, json.dumps({"seq": i, **body}).encode(), props)


def config_for(tmp: Path, queue: str, policy: str, *, prefetch: int = 20,
               metrics: int = 0) -> Path:
    config = make_config(tmp, handler="tests.brokers.handlers:Flaky", source="rabbitmq",
                         producers=2, processors=2,
                         options={"url": AMQP_URL, "queue": queue, "on_failure": policy,
                                  "prefetch_count": prefetch},
                         batchers={"default": {"batch_size": 20, "batch_timeout": 0.1}})
    if metrics:
        config.write_text(config.read_text().replace(
            'listen = ""', f'listen = "127.0.0.1:{metrics}"'))
    return config


def test_failures_that_go_through_on_the_other_producer_are_not_failed(short_tmp: Path,
                                                                      rabbit) -> None:
    """Every message fails on its first delivery and goes through on its second.  The
    prefetch window holds the whole queue, so neither producer's window is full when a
    failure goes back to the queue: the broker hands it to either producer, about half
    of them to the other one.  ``--until-idle`` exits 0, nothing failed (the failed
    deliveries are counted apart), the queue empty."""
    n = 300
    queue = rabbit.queue()
    publish(rabbit, queue, [{"flaky": True}] * n)
    started = time.monotonic()
    proc = run_until_idle(config_for(short_tmp, queue, "reject_and_requeue", prefetch=1000),
                          timeout=120)
    took = time.monotonic() - started
    assert proc.returncode == 0, (took, proc.stdout[-2000:], proc.stderr[-4000:])
    line = summary(proc.stdout)
    assert f"e2e: {n} messages acked, 0 failed; {n} deliveries failed, {n} of them " \
           f"requeued for another try" in line, line
    # each producer's log line adds up the same books: nothing failing on either
    books = re.findall(r"producer_\d: source rabbitmq fetched \d+, acked (\d+), failed (\d+)",
                       proc.stderr)
    assert len(books) == 2 and sum(int(a) for a, _ in books) == n, books
    assert [f for _, f in books] == ["0", "0"], books
    assert rabbit.ready(queue) == 0


def test_poison_across_two_producers_counts_each_message_once(short_tmp: Path,
                                                             rabbit) -> None:
    """``reject_and_requeue_once``: a poison message fails on one producer (requeued), then
    on a producer that gets it back (rejected, to the dead letters); flaky ones fail once and
    go through.  While the daemon runs, ``status --json`` and ``/metrics`` count exactly
    the poison messages as failed and none as failing; the stop's summary says the same;
    the dead-letter queue holds exactly the poison.  The messages are published while both
    producers consume and have room, so the broker hands a requeued message to either."""
    n, every = 400, 10
    poison = {i for i in range(n) if i % every == 3}
    queue = rabbit.queue(dlx=True)
    port = free_port()
    config = config_for(short_tmp, queue, "reject_and_requeue_once", metrics=port)
    log = open(short_tmp / "daemon.log", "w+")
    daemon = subprocess.Popen(offbroadway_cmd("run", str(config)), cwd=REPO, env=test_env(),
                              stdout=subprocess.PIPE, stderr=log, text=True)
    acked, failed = n - len(poison), len(poison)
    try:
        wait_until(lambda: (st := status(config)) and not st.get("sources_down")
                   and len(consuming(st)) == 2, timeout=60, interval=0.1,
                   message="both producers consuming")
        bodies = [{"fail": i in poison, "flaky": i % 2 == 0 and i not in poison}
                  for i in range(n)]
        for start in range(0, n, 10):      # paced: neither producer's window fills up
            publish(rabbit, queue, bodies[start:start + 10], first=start)
            time.sleep(0.02)
        def settled(s: dict) -> bool:
            # each producer's own figures add up to the same, once the daemon's word
            # reached them (the books the metrics export)
            producers = [node.get("messages", {}) for node in walk(s.get("tree", {}))
                         if node.get("id", "").startswith("producer_")]
            own = (sum(p.get("source", {}).get("failed", 0) for p in producers),
                   sum(p.get("failing", 0) for p in producers))
            return (s.get("acked"), s.get("failed"), s.get("failing"), own) == \
                (acked, failed, 0, (failed, 0))

        def books(t: str) -> bool:
            return (metric(t, "offbroadway_messages_acked_total"),
                    metric(t, "offbroadway_messages_failed_total"),
                    metric(t, "offbroadway_messages_failing")) == (acked, failed, 0)

        _, scrape, out = settle_then_stop(daemon, log, config, port, settled=settled,
                                          flushed=books,
                                          what=f"{acked} acked, {failed} failed, 0 failing")
        assert metric(scrape, "offbroadway_message_failures_total") >= 2 * failed
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(30)
    log.seek(0)
    err = log.read()
    assert daemon.returncode == 0, err[-3000:]
    line = summary(out)
    assert f"e2e: {acked} messages acked, {failed} failed" in line, line
    # the poison failed twice each (requeued once, then rejected), the flaky once each
    flaky = sum(1 for i in range(n) if i % 2 == 0 and i not in poison)
    assert failed_deliveries(line) == 2 * failed + flaky, line
    assert rabbit.ready(queue) == 0
    dead = rabbit.take_all(f"{queue}.dlq")
    assert len(dead) == failed
    assert sorted(m for m in dead if m) == sorted(f"m{i}" for i in poison if i % 2)


def consuming(st: dict) -> list[dict]:
    """The producers whose source is connected, from ``status --json``."""
    return [node for node in walk(st.get("tree", {})) if node.get("id", "").startswith(
        "producer_") and node.get("messages", {}).get("source", {}).get("state") == "connected"]


def walk(node: dict):
    yield node
    for c in node.get("children", []):
        yield from walk(c)


def test_messages_failing_for_ever_on_both_producers_end_the_run_counted_once(
        short_tmp: Path, rabbit) -> None:
    """The default policy and only messages that fail on every delivery, which the broker
    hands to both producers in turn: ``--until-idle`` still ends (exit 3), each message
    counted once, and the broker holds them all."""
    n = 40
    queue = rabbit.queue()
    publish(rabbit, queue, [{"fail": True}] * n)
    proc = run_until_idle(config_for(short_tmp, queue, "reject_and_requeue", prefetch=1000),
                          timeout=120)
    assert proc.returncode == 3, (proc.stdout[-2000:], proc.stderr[-4000:])
    line = summary(proc.stdout)
    assert f"e2e: 0 messages acked, {n} failed" in line, line
    last = [ln for ln in proc.stderr.splitlines() if "--until-idle" in ln]
    assert last and f"{n} message(s) stay in queue {queue!r}" in last[-1], proc.stderr[-3000:]
    wait_until(lambda: rabbit.ready(queue) == n, timeout=10, message=f"{n} back in the queue")


def test_a_producer_sigkilled_while_failed_messages_go_through_leaves_none_failing(
        short_tmp: Path, rabbit) -> None:
    """Every message fails on its first delivery and goes through on its second; a
    producer is SIGKILLed while that happens.  What it settled since its last report
    (redelivered messages that went through: their failure noted earlier) must not stay
    in the books as failing: ``--until-idle`` exits 0, nothing failed, the queue empty."""
    n = 4000
    queue = rabbit.queue()
    publish(rabbit, queue, [{"flaky": True}] * n)
    config = config_for(short_tmp, queue, "reject_and_requeue", prefetch=50)
    daemon = subprocess.Popen(offbroadway_cmd("run", str(config), "--until-idle"), cwd=REPO,
                              env=test_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        wait_until(lambda: status(config).get("acked", 0) >= 400, timeout=60, interval=0.05,
                   message="400 acked")
        kill_when_running(config, "producer_0")
        assert rabbit.ready(queue) > 100, "the run was over before the kill"
        out, err = daemon.communicate(timeout=150)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(30)
    assert "producer_0" in err and "killed by SIGKILL" in err, err[-3000:]
    line = summary(out)
    assert daemon.returncode == 0, (line, err[-4000:])
    assert line.startswith(f"e2e: {n} messages acked, 0 failed"), line
    assert rabbit.ready(queue) == 0
