"""One count per message, on every surface: a RabbitMQ run with a handler that fails 1% of
the messages on every delivery (the default policy requeues them), a processor and a batch
processor SIGKILLed on the way, then a stop.  The summary, the log line before it, ``status
--json`` and ``/metrics`` say the same acked and failed figures, and the broker holds
exactly the failed messages afterwards."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest

from tests.brokers.conftest import AMQP_URL
from tests.conftest import REPO, free_port, offbroadway_cmd, test_env, wait_until
from tests.e2e.test_pipeline import make_config

pytestmark = pytest.mark.broker

N, FAILING = 400, 4


def status(config: Path) -> dict:
    res = subprocess.run(offbroadway_cmd("status", "--json", "--config", str(config)),
                         cwd=REPO, env=test_env(), capture_output=True, text=True, timeout=60)
    return json.loads(res.stdout) if res.returncode == 0 else {}


def kill_when_running(config: Path, child: str) -> None:
    """SIGKILL ``child`` once status shows it running (a cascade may be restarting it)."""
    def killed() -> bool:
        st = status(config)
        node = next((n for n in walk(st["tree"]) if n["id"] == child), {}) if st else {}
        if node.get("state") != "running" or not node.get("pid"):
            return False
        try:
            os.kill(node["pid"], signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True
    wait_until(killed, timeout=30, interval=0.05, message=f"{child} running, then killed")


def walk(node: dict):
    yield node
    for c in node.get("children", []):
        yield from walk(c)


def metric(text: str, name: str) -> float:
    return sum(float(m) for m in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def settle_then_stop(daemon: subprocess.Popen, log: IO[str], config: Path, port: int, *,
                     settled: Callable[[dict], bool], flushed: Callable[[str], bool],
                     what: str, timeout: float = 60) -> tuple[dict, str, str]:
    """Wait until ``status --json`` is ``settled`` (else fail: not ``what``, with the
    daemon's log), then until a ``/metrics`` scrape is ``flushed``, then stop the daemon
    (SIGTERM) and wait for it: (that status, that scrape, its stdout).  The caller kills
    the daemon if it is still running."""
    seen: list[dict] = [{}]

    def polled() -> dict | None:
        s = seen[0] = status(config)
        return s if settled(s) else None

    try:
        st = wait_until(polled, timeout=timeout, interval=0.2, message="all settled")
    except AssertionError:
        pytest.fail(f"not {what} in status: "
                    f"{ {k: v for k, v in seen[0].items() if k != 'tree'} }\n"
                    + Path(log.name).read_text()[-6000:])

    def scraped() -> str | None:
        t = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        return t.decode() if flushed(t.decode()) else None

    scrape = wait_until(scraped, timeout=10, message="the metrics' next flush")
    daemon.send_signal(signal.SIGTERM)
    out, _ = daemon.communicate(timeout=90)
    return st, scrape, out


def _start(tmp: Path, rabbit, n: int, *, slow: float
           ) -> tuple[str, Path, int, IO[str], subprocess.Popen]:
    """A queue of ``n`` messages (``message_id`` m<i>; one in a hundred fails, the seq 42
    of each hundred) and a daemon running on it, ``/metrics`` on a free port, its log in
    ``tmp/daemon.log``: (queue, config, port, the log, the daemon)."""
    import pika

    queue = rabbit.queue()
    rabbit.ch.confirm_delivery()
    for i in range(n):
        body = json.dumps({"seq": i, "fail": i % 100 == 42}).encode()
        rabbit.ch.basic_publish("", queue, body, pika.BasicProperties(message_id=f"m{i}"))
    port = free_port()
    config = make_config(tmp, handler="tests.brokers.handlers:JsonBody", source="rabbitmq",
                         context={"slow": slow},
                         options={"url": AMQP_URL, "queue": queue, "prefetch_count": 50},
                         batchers={"default": {"batch_size": 20, "batch_timeout": 0.2}})
    config.write_text(config.read_text().replace('listen = ""', f'listen = "127.0.0.1:{port}"'))
    log = open(tmp / "daemon.log", "w+")
    daemon = subprocess.Popen(offbroadway_cmd("run", str(config)), cwd=REPO, env=test_env(),
                              stdout=subprocess.PIPE, stderr=log, text=True)
    return queue, config, port, log, daemon


def test_summary_log_status_and_metrics_agree_with_the_broker(short_tmp: Path, rabbit) -> None:

    queue, config, port, log, daemon = _start(short_tmp, rabbit, N, slow=0.003)
    try:
        wait_until(lambda: status(config).get("acked", 0) >= 80, timeout=60,
                   interval=0.05, message="80 acked")
        kill_when_running(config, "processor_default_0")
        wait_until(lambda: status(config).get("acked", 0) >= 200, timeout=60,
                   interval=0.05, message="200 acked")
        kill_when_running(config, "batch_processor_default_0")
        st, scrape, out = settle_then_stop(
            daemon, log, config, port,
            settled=lambda s: s.get("acked") == N - FAILING and s.get("failed") == FAILING,
            flushed=lambda t: metric(t, "offbroadway_messages_acked_total") == N - FAILING,
            what=f"{N - FAILING} acked and {FAILING} failed")
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(30)
    log.seek(0)
    err = log.read()
    assert daemon.returncode == 0, err[-3000:]
    # status, in messages
    assert st["failing"] == FAILING and st["failed_deliveries"] >= FAILING, st
    # /metrics: settled failures plus those back in the queue are the failed messages
    assert metric(scrape, "offbroadway_messages_failed_total") + \
        metric(scrape, "offbroadway_messages_failing") == FAILING, scrape
    assert metric(scrape, "offbroadway_message_failures_total") >= FAILING
    # the summary and the log line before it
    summary = [ln for ln in out.splitlines() if "messages acked" in ln]
    assert len(summary) == 1 and f"e2e: {N - FAILING} messages acked, {FAILING} failed" \
        in summary[0], out
    assert "left unacked" not in summary[0], summary
    books = re.search(r"producer_0: source rabbitmq fetched \d+, acked (\d+), failed (\d+), "
                      r"unacked (\d+)", err)
    assert books and books.groups() == (str(N - FAILING), str(FAILING), "0"), \
        (books and books[0], err[-3000:])
    # the broker: exactly the failed messages are left, back in the queue
    wait_until(lambda: rabbit.ready(queue) == FAILING, timeout=10,
               message=f"{FAILING} messages in the queue")
    assert sorted(rabbit.take_all(queue)) == sorted(f"m{i}" for i in range(N) if i % 100 == 42)


# the spool's case is the default run's (tests/e2e/test_counts_truth.py)
@pytest.mark.slow
def test_acks_a_producer_made_before_its_sigkill_are_counted_on_every_surface(
        short_tmp: Path, rabbit) -> None:
    """The producer SIGKILLed while acks flow: it sends no report as it dies, yet what it
    acked at the broker since its last report must be in the summary, ``status`` and
    ``/metrics`` (the broker never delivers those messages again)."""

    n = 3000
    failing = n // 100
    queue, config, port, log, daemon = _start(short_tmp, rabbit, n, slow=0.002)
    try:
        wait_until(lambda: 300 <= status(config).get("acked", 0), timeout=60,
                   interval=0.05, message="300 acked")
        left = rabbit.ready(queue)
        kill_when_running(config, "producer_0")
        assert left > 1000, "the run was nearly over before the kill"
        st, scrape, out = settle_then_stop(
            daemon, log, config, port,
            settled=lambda s: s.get("acked", 0) >= n - failing and s.get("failed") == failing,
            flushed=lambda t: metric(t, "offbroadway_messages_acked_total") >= n - failing,
            what=f"{n - failing} acked and {failing} failed", timeout=90)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(30)
    log.seek(0)
    err = log.read()
    assert daemon.returncode == 0, err[-3000:]
    assert "producer_0" in err and "killed by SIGKILL" in err, err[-3000:]
    assert st["acked"] == n - failing, {k: v for k, v in st.items() if k != "tree"}
    assert metric(scrape, "offbroadway_messages_acked_total") == n - failing
    summary = [ln for ln in out.splitlines() if "messages acked" in ln]
    assert len(summary) == 1 and f"e2e: {n - failing} messages acked, {failing} failed" \
        in summary[0], out + err[-3000:]
    assert sorted(rabbit.take_all(queue)) == sorted(f"m{i}" for i in range(n)
                                                    if i % 100 == 42)
