"""A broker that is down, at start and in the middle of a run (issue 17): the daemon says so
in one line per reconnect attempt naming the cause and the next attempt's time, a bounded
number of lines per minute, no client-library noise or traceback; ``status`` shows the
source disconnected; the pipeline is not announced as up until the source is; and once the
broker is back every message goes through, nothing lost.

The broker is reached through the TCP proxy of the broker tests, so taking it "down"
touches no server other tests use.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from offbroadway.supervision.tree import snapshot_find

from tests.brokers.conftest import TcpProxy, unique
from tests.conftest import REPO, offbroadway_cmd, test_env, wait_until
from tests.e2e.handlers import read_records
from tests.e2e.test_operations import free_port
from tests.e2e.test_pipeline import make_config

pytestmark = pytest.mark.broker
N = 2000
BACKOFF_MIN, BACKOFF_MAX = 0.1, 2.0
#: how long the broker stays unreachable at start while the log is watched
WINDOW = 8.0


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(offbroadway_cmd(*args), cwd=REPO, env=test_env(), capture_output=True,
                          text=True, timeout=60)


def status(sock: Path) -> dict | None:
    out = cli("status", "--json", "--socket", str(sock))
    return json.loads(out.stdout) if out.returncode == 0 else None


def producer_connected(sock: Path) -> int | None:
    s = status(sock)
    if s is None:
        return None
    node = snapshot_find(s["tree"], "producer_0")
    if node is None:
        return None
    return (node.get("messages") or {}).get("source_connected")


def max_lines(seconds: float) -> int:
    """Attempts the backoff allows in ``seconds``: the ramp from BACKOFF_MIN to the cap,
    then one per BACKOFF_MAX / 2 at most (base.backoff_wait's equal jitter), plus one."""
    ramp = math.ceil(math.log2(BACKOFF_MAX / BACKOFF_MIN)) + 1
    return ramp + math.ceil(seconds / (BACKOFF_MAX / 2)) + 1


def run_outage(short_tmp: Path, source: str, options: dict, handler: str, publish,
               expected: set[str], proxy: TcpProxy) -> None:
    config = make_config(short_tmp, handler=handler, source=source, options={
        **options, "backoff_min": BACKOFF_MIN, "backoff_max": BACKOFF_MAX},
        batchers={"default": {"batch_size": 100, "batch_timeout": 0.2}})
    port = free_port()
    config.write_text(config.read_text().replace('listen = ""', f'listen = "127.0.0.1:{port}"'))

    def gauge() -> float | None:
        """offbroadway_source_connected of producer_0, as Prometheus scrapes it."""
        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        except OSError:
            return None
        m = re.search(r'^offbroadway_source_connected\{[^}]*child="producer_0"[^}]*\} (\S+)$',
                      body.decode(), re.M)
        return float(m.group(1)) if m else None
    log = short_tmp / "daemon.log"
    sock = short_tmp / "run" / "control.sock"
    out = short_tmp / "out"
    proxy.down()
    with open(log, "w") as f:
        daemon = subprocess.Popen(offbroadway_cmd("run", str(config)), cwd=REPO, env=test_env(),
                                  stdout=f, stderr=subprocess.STDOUT, text=True)
    try:
        # -- down from the start ----------------------------------------------------------
        wait_until(lambda: producer_connected(sock) == 0, timeout=60,
                   message="status to show the source disconnected")
        s = status(sock)
        assert s is not None and s["sources_down"], s
        assert "Connection refused" in s["sources_down"][0] or "refused" in \
            s["sources_down"][0].lower(), s["sources_down"]
        first = time.monotonic()
        time.sleep(WINDOW)     # the window the log is measured over (a duration, not a wait)
        text = log.read_text()
        retries = [ln for ln in text.splitlines() if "attempt " in ln and "failed, next in" in ln]
        assert retries, text[-3000:]
        elapsed = time.monotonic() - first + 5   # lines written before the window began
        assert len(retries) <= max_lines(elapsed), (len(retries), elapsed, retries)
        for ln in retries:
            assert "refused" in ln.lower(), ln                 # the cause, not "Error: "
            assert re.search(r"next in \d+\.\d+s \(at \d\d:\d\d:\d\d\)", ln), ln
        assert "Traceback" not in text and "pika." not in text, text[-3000:]
        assert " is up" not in text                             # not while the source is down
        assert "waiting for its source" in text
        wait_until(lambda: gauge() == 0.0, timeout=10, message="the gauge at 0 while down")

        # -- back: everything published meanwhile goes through -----------------------------
        publish(0, N // 2)
        proxy.up()
        wait_until(lambda: " is up" in log.read_text(), timeout=60, message="'is up' once back")
        wait_until(lambda: len({r["id"] for r in read_records(str(out), "batch-")}) >= N // 4,
                   timeout=60, message="messages flowing")

        # -- down in the middle of the run, then back ---------------------------------------
        proxy.down()
        wait_until(lambda: producer_connected(sock) == 0, timeout=60,
                   message="status to show the source lost")
        publish(N // 2, N)
        proxy.up()
        wait_until(lambda: {r["id"] for r in read_records(str(out), "batch-")} >= expected,
                   timeout=120, message="every message handled after the outages")
        wait_until(lambda: producer_connected(sock) == 1, timeout=30,
                   message="status to show the source connected")
        wait_until(lambda: gauge() == 1.0, timeout=10, message="the gauge at 1 once back")
        stop = cli("stop", "--socket", str(sock))
        assert stop.returncode == 0, stop.stderr
        assert daemon.wait(30) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    handled = {r["id"] for r in read_records(str(out), "batch-")}
    assert handled == expected
    assert "Traceback" not in log.read_text()


def test_rabbitmq_down_at_start_and_mid_run(short_tmp: Path, rabbit) -> None:
    queue = rabbit.queue()
    proxy = TcpProxy(5672)
    rabbit.ch.confirm_delivery()

    def publish(start: int, stop: int) -> None:
        import pika
        for i in range(start, stop):
            rabbit.ch.basic_publish("", queue, json.dumps({"seq": i}).encode(),
                                    pika.BasicProperties(message_id=f"m{i}"))

    try:
        run_outage(short_tmp, "rabbitmq", {
            "url": f"amqp://guest:guest@127.0.0.1:{proxy.port}/%2F", "queue": queue,
            "heartbeat": 5}, "tests.brokers.handlers:JsonBody", publish,
            {f"m{i}" for i in range(N)}, proxy)
        assert rabbit.ready(queue) == 0
    finally:
        proxy.down()


# RabbitMQ's runs by default: long: not in the default run (pytest -m slow)
@pytest.mark.slow
def test_redis_down_at_start_and_mid_run(short_tmp: Path, rq) -> None:
    stream = unique("s")
    rq.test_streams.append(stream)
    proxy = TcpProxy(6379)
    ids: list[str] = []

    def publish(start: int, stop: int) -> None:
        pipe = rq.pipeline(transaction=False)
        for i in range(start, stop):
            pipe.xadd(stream, {"seq": str(i), "fail": ""})
        ids.extend(i.decode() if isinstance(i, bytes) else i for i in pipe.execute())

    # the group must exist before entries are added, or they are "before" it
    rq.xgroup_create(stream, "pipeline", id="0", mkstream=True)
    expected: set[str] = set()   # filled as entries are published (ids come from Redis)
    try:
        # the ids are known only once published: publish, then compare against them
        def publish_and_expect(start: int, stop: int) -> None:
            publish(start, stop)
            expected.update(ids)

        run_outage(short_tmp, "redis", {
            "url": f"redis://127.0.0.1:{proxy.port}/0", "stream": stream,
            "group": "pipeline", "create_group": False}, "tests.brokers.handlers:FieldMap",
            publish_and_expect, expected, proxy)
        assert len(expected) == N
        assert rq.xpending(stream, "pipeline")["pending"] == 0
    finally:
        proxy.down()
