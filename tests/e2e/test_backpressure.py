"""Back-pressure, end to end against the real RabbitMQ (issue 8, item 5; the long form with
a SIGSTOPped Spark JVM is bench/backpressure.py): while the batch sink is stalled the
producer stops fetching, so the broker keeps what it has not delivered (its ready count does
not move), the unacked window never exceeds the prefetch, and the tree's memory stays flat;
when the sink answers again, everything drains and nothing is lost."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.brokers.conftest import AMQP_URL, rabbit  # noqa: F401
from tests.conftest import start_daemon, wait_until
from tests.e2e.daemon_status import producer_books, tree_rss
from tests.e2e.handlers import read_records
from tests.e2e.test_pipeline import make_config

pytestmark = pytest.mark.broker
N = 20_000
PAYLOAD = 4096                 # 80 MB in the queue: buffering it would show in RSS
STALL = 5.0
#: samples the stall is observed over, however slowly they come
MIN_SAMPLES = 10
RSS_GROWTH_LIMIT = 40 * 2**20


def broker_unacked(queue: str) -> int:
    out = subprocess.run(["rabbitmqctl", "-q", "list_queues", "name",
                          "messages_unacknowledged"], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return next(int(line.split()[1]) for line in out.splitlines()
                if line.split()[:1] == [queue])


# the spool's runs by default: long: not in the default run (pytest -m slow)
@pytest.mark.slow
def test_a_stalled_sink_stops_the_producer_and_memory_stays_flat(short_tmp: Path,
                                                               rabbit) -> None:  # noqa: F811
    import pika

    queue = rabbit.queue()
    pad = "p" * PAYLOAD
    for i in range(N):
        rabbit.ch.basic_publish("", queue, json.dumps({"seq": i, "pad": pad}).encode(),
                                pika.BasicProperties(message_id=f"m{i}"))
    gate = short_tmp / "gate"
    config = make_config(short_tmp, handler="tests.e2e.backpressure_handlers:GatedBatches",
                         source="rabbitmq", max_demand=50, context={"gate": str(gate)},
                         options={"url": AMQP_URL, "queue": queue},
                         batchers={"default": {"batch_size": 200, "batch_timeout": 0.2}})
    sock = short_tmp / "run" / "control.sock"
    daemon = start_daemon(config, "--until-idle")
    try:
        wait_until(lambda: sock.exists() and producer_books(sock).get("acked", 0) >= 2000,
                   timeout=120, interval=0.2, message="2000 messages acked")
        gate.touch()                                         # the sink stops answering

        seen: list[dict] = []

        def filled_up() -> bool:
            seen.append(producer_books(sock))
            src = seen[-1]
            return (src.get("unacked") == src.get("prefetch_count") and len(seen) >= 3
                    and seen[-3]["fetched"] == src["fetched"])

        wait_until(filled_up, timeout=60, interval=0.5,
                   message="the pipeline full and the producer no longer fetching")
        base = seen[-1]
        window = base["prefetch_count"]
        ready0, rss0 = rabbit.ready(queue), tree_rss(daemon.pid)
        assert 0 < ready0 < N - 2000
        samples = []
        # an observation window, not a wait: at least STALL seconds and MIN_SAMPLES samples
        # (a sample is three round trips and a psutil walk: under load fewer fit in STALL);
        # the deadline only keeps a stuck daemon from holding the test forever
        end, deadline = time.monotonic() + STALL, time.monotonic() + 12 * STALL
        while (time.monotonic() < end or len(samples) < MIN_SAMPLES) \
                and time.monotonic() < deadline:
            src = producer_books(sock)
            samples.append((src["fetched"], src["inflight"], src["unacked"],
                            rabbit.ready(queue), tree_rss(daemon.pid)))
            time.sleep(0.25)
        unacked_at_broker = broker_unacked(queue)
        gate.unlink()                                        # the sink answers again
        code = daemon.wait(180)
    finally:
        if gate.exists():
            gate.unlink()
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(60)
    stderr = daemon.stderr.read()
    assert code == 0, stderr[-3000:]
    assert len(samples) >= MIN_SAMPLES
    assert {s[0] for s in samples} == {base["fetched"]}, "the producer fetched while stalled"
    assert max(s[1] for s in samples) <= window and max(s[2] for s in samples) <= window
    assert {s[3] for s in samples} == {ready0}, "the broker delivered while stalled"
    assert unacked_at_broker <= window
    growth = max(s[4] for s in samples) - rss0
    assert growth < RSS_GROWTH_LIMIT, f"tree RSS grew by {growth / 2**20:.1f} MiB"
    print(f"stalled {STALL:.0f} s: window {window}, ready {ready0}, broker unacked "
          f"{unacked_at_broker}, tree RSS {rss0 / 2**20:.0f} MiB (+{growth / 2**20:.1f})")
    # after the stall: everything handled once, the queue empty
    handled = Counter(r["id"] for r in read_records(str(short_tmp / "out"), "batch-"))
    assert set(handled) == {f"m{i}" for i in range(N)} and max(handled.values()) == 1
    assert not read_records(str(short_tmp / "out"), "failed-")
    assert rabbit.ready(queue) == 0
