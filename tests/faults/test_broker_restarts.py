"""The machine's own brokers restarted under a running pipeline: RabbitMQ's application
(``rabbitmqctl stop_app`` / ``start_app``) and its whole node, Redis and NATS JetStream
(a graceful shutdown and a start with the command CI uses).

For each: messages flow, the server goes away, ``status`` and ``/metrics`` show the source
disconnected, the server comes back, more is published, and then every message is handled
(at least once; none lost, nothing that was never published), ``status`` and the gauge say
connected again, the log has at most the lines the reconnect backoff allows and no
traceback, and the daemon stops with exit 0.  The broker's own books end empty.

These restart servers that other test runs use: they carry the ``restarts_brokers`` marker
and are run on a shared machine only under ``flock -x /work/cpu.lock`` (CI runs them in the
normal suite, where nothing else runs).  A fixture brings every server back and checks that
it answers before the test ends, whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.brokers.test_broker_down import (
    BACKOFF_MAX,
    BACKOFF_MIN,
    cli,
    max_lines,
    producer_connected,
    status,
)
from tests.conftest import REPO, free_port, offbroadway_cmd, test_env, wait_until
from tests.e2e.handlers import read_records
from tests.e2e.test_pipeline import make_config

pytestmark = [pytest.mark.broker, pytest.mark.restarts_brokers]
N = 3000


# -- the servers ------------------------------------------------------------------------------

def answers(port: int, greeting: bytes = b"") -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        try:
            s.connect(("127.0.0.1", port))
            if greeting:
                return s.recv(len(greeting)).startswith(greeting)
            return True
        except OSError:
            return False


def sh(*cmd: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


class Server:
    """One of the machine's servers, taken down and brought back the way an operator
    would; ``healthy()`` is the check that it is back for everyone else."""

    name = ""

    def down(self) -> None:
        raise NotImplementedError

    def up(self) -> None:
        raise NotImplementedError

    def healthy(self) -> bool:
        raise NotImplementedError


class RabbitApp(Server):
    """``rabbitmqctl stop_app`` / ``start_app``: the node stays, the broker stops."""

    name = "rabbitmq (stop_app)"

    def down(self) -> None:
        res = sh("rabbitmqctl", "-q", "stop_app")
        assert res.returncode == 0, res.stderr

    def up(self) -> None:
        sh("rabbitmqctl", "-q", "start_app")

    def healthy(self) -> bool:
        if not answers(5672):
            return False
        return sh("rabbitmqctl", "-q", "await_startup", timeout=60).returncode == 0


class RabbitNode(RabbitApp):
    """The whole node: ``rabbitmqctl stop``, then ``rabbitmq-server -detached``."""

    name = "rabbitmq (node)"

    def down(self) -> None:
        res = sh("rabbitmqctl", "-q", "stop")
        assert res.returncode == 0, res.stderr
        wait_until(lambda: not answers(5672), timeout=60, message="RabbitMQ down")

    def up(self) -> None:
        if not answers(5672):
            sh("rabbitmq-server", "-detached")
        wait_until(lambda: answers(5672), timeout=120, interval=0.5, message="RabbitMQ up")
        sh("rabbitmqctl", "-q", "await_startup", timeout=120)


class Redis(Server):
    """``SHUTDOWN SAVE`` (the shared server keeps no snapshot of its own: this one is what
    carries the streams across) and the start command of .ci/run, which loads it."""

    name = "redis"
    START = ["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port",
             "6379", "--save", "", "--appendonly", "no", "--dir", "/var/lib/redis",
             "--logfile", "/var/log/redis/ci.log"]

    def down(self) -> None:
        sh("redis-cli", "-p", "6379", "shutdown", "save")
        wait_until(lambda: not answers(6379), timeout=60, message="Redis down")

    def up(self) -> None:
        if not answers(6379):
            sh(*self.START)
        wait_until(self.healthy, timeout=60, interval=0.2, message="Redis up")

    def healthy(self) -> bool:
        return sh("redis-cli", "-p", "6379", "ping", timeout=10).stdout.strip() == "PONG"


class Nats(Server):
    """A graceful stop (``nats-server --signal quit``, the store flushed) and the start
    command of .ci/run; JetStream's file store carries the stream across."""

    name = "nats"
    START = ["start-stop-daemon", "--start", "--oknodo", "--background", "--exec",
             "/usr/sbin/nats-server", "--", "-a", "127.0.0.1", "-p", "4222", "-js", "-sd",
             "/var/lib/nats-server", "-l", "/var/log/nats-server.log"]

    def pid(self) -> int | None:
        res = sh("pgrep", "-x", "nats-server", "-a")
        for line in res.stdout.splitlines():
            if " -p 4222" in line:
                return int(line.split()[0])
        return None

    def down(self) -> None:
        pid = self.pid()
        assert pid is not None, "the shared nats-server is not running"
        res = sh("nats-server", "--signal", f"quit={pid}")
        assert res.returncode == 0, res.stderr
        wait_until(lambda: self.pid() is None, timeout=60, message="nats-server gone")

    def up(self) -> None:
        if self.pid() is None:
            sh(*self.START)
        wait_until(self.healthy, timeout=60, interval=0.2, message="nats-server up")

    def healthy(self) -> bool:
        return answers(4222, b"INFO")


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    """Every server a test touched is brought back and must answer before it ends."""
    touched: list[Server] = []
    yield touched
    broken = []
    for server in touched:
        try:
            if not server.healthy():
                server.up()
            wait_until(server.healthy, timeout=120, interval=0.5,
                       message=f"{server.name} answering again")
        except Exception as exc:     # the others must still be brought back
            broken.append(f"{server.name}: {exc}")
    assert not broken, f"servers not back after the test: {broken}"


# -- the run ----------------------------------------------------------------------------------

def gauge(port: int) -> float | None:
    """offbroadway_source_connected of producer_0, as Prometheus scrapes it."""
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    except OSError:
        return None
    m = re.search(r'^offbroadway_source_connected\{[^}]*child="producer_0"[^}]*\} (\S+)$',
                  body.decode(), re.M)
    return float(m.group(1)) if m else None


def handled(out: Path) -> set[str]:
    return {r["id"] for r in read_records(str(out), "batch-")}


def through_a_restart(tmp: Path, server: Server, servers: list[Server], *, source: str,
                      options: dict, handler: str,
                      publish: Callable[[int, int], list[str]]) -> dict:
    """Run the pipeline across ``server`` going down and up; returns figures to print."""
    # slow enough that messages are in flight when the server goes (4 ms each, two
    # processors: the first half takes about 3 s)
    config = make_config(tmp, handler=handler, source=source, context={"slow": 0.004},
                         options={**options, "backoff_min": BACKOFF_MIN,
                                  "backoff_max": BACKOFF_MAX},
                         batchers={"default": {"batch_size": 100, "batch_timeout": 0.2}})
    port = free_port()
    config.write_text(config.read_text().replace('listen = ""', f'listen = "127.0.0.1:{port}"'))
    log = tmp / "daemon.log"
    sock = tmp / "run" / "control.sock"
    out = tmp / "out"
    expected = set(publish(0, N // 2))
    with open(log, "w") as f:
        daemon = subprocess.Popen(offbroadway_cmd("run", str(config)), cwd=REPO, env=test_env(),
                                  stdout=f, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: len(handled(out)) >= N // 4, timeout=120, interval=0.2,
                   message="messages flowing before the restart")
        lines_before = len(log.read_text().splitlines())
        t_down = time.monotonic()
        servers.append(server)
        server.down()
        wait_until(lambda: producer_connected(sock) == 0, timeout=60, interval=0.2,
                   message="status to show the source disconnected")
        s = status(sock)
        assert s is not None and s["sources_down"], s
        wait_until(lambda: gauge(port) == 0.0, timeout=10, message="the gauge at 0 while down")
        handled_down = len(handled(out))
        server.up()
        expected |= set(publish(N // 2, N))
        wait_until(lambda: handled(out) >= expected, timeout=240, interval=0.5,
                   message="every message handled after the restart")
        wait_until(lambda: producer_connected(sock) == 1, timeout=60,
                   message="status to show the source connected")
        wait_until(lambda: gauge(port) == 1.0, timeout=10, message="the gauge at 1 once back")
        outage = time.monotonic() - t_down
        stop = cli("stop", "--socket", str(sock))
        assert stop.returncode == 0, stop.stderr
        assert daemon.wait(60) == 0
    except BaseException:
        print(log.read_text()[-6000:])
        raise
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(30)
    text = log.read_text()
    got = handled(out)
    assert got == expected, (len(expected - got), len(got - expected))
    assert handled_down < N // 2, "the restart came after everything published was handled"
    after = text.splitlines()[lines_before:]
    retries = [ln for ln in after if "attempt " in ln and "failed, next in" in ln]
    assert len(retries) <= max_lines(outage), (len(retries), outage, retries[-5:])
    warnings = [ln for ln in after if " WARNING " in ln or " ERROR " in ln]
    assert "Traceback" not in text, text[-4000:]
    records = read_records(str(out), "batch-")
    return {"outage_s": round(outage, 1), "retry_lines": len(retries),
            "warning_lines": len(warnings), "log_lines": len(after),
            "duplicates": len(records) - len(got), "handled_while_down": handled_down}


# -- RabbitMQ ---------------------------------------------------------------------------------

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


def _amqp(fn: Callable[[object], object]) -> object:
    """A fresh connection per use: the broker restarts between uses."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        return fn(conn.channel())
    finally:
        with contextlib.suppress(Exception):
            conn.close()


@pytest.fixture
def durable_queue(servers: list[Server]) -> Iterator[str]:
    """A durable queue (a broker restart keeps it and its persistent messages)."""
    pytest.importorskip("pika")
    name = f"obtest-restart-{uuid.uuid4().hex[:10]}"
    _amqp(lambda ch: ch.queue_declare(name, durable=True))
    yield name
    with contextlib.suppress(Exception):
        _amqp(lambda ch: ch.queue_delete(name))


def rabbit_publisher(queue: str) -> Callable[[int, int], list[str]]:
    def publish(start: int, stop: int) -> list[str]:
        import pika

        def go(ch: object) -> None:
            ch.confirm_delivery()    # type: ignore[attr-defined]
            for i in range(start, stop):
                ch.basic_publish("", queue, json.dumps({"seq": i}).encode(),  # type: ignore
                                 pika.BasicProperties(message_id=f"m{i}", delivery_mode=2))
        _amqp(go)
        return [f"m{i}" for i in range(start, stop)]
    return publish


def rabbit_settled(queue: str) -> tuple[int, int]:
    res = sh("rabbitmqctl", "-q", "list_queues", "name", "messages_ready",
             "messages_unacknowledged")
    for line in res.stdout.splitlines():
        parts = line.split("\t")
        if parts[0] == queue:
            return int(parts[1]), int(parts[2])
    raise AssertionError(f"queue {queue} not listed: {res.stdout[-500:]}")


# stop_app/start_app is long (not in the default run: pytest -m slow); the node's
# restart runs by default
@pytest.mark.parametrize("server", [pytest.param(RabbitApp(), marks=pytest.mark.slow),
                                    RabbitNode()], ids=lambda s: s.name)
def test_rabbitmq_restarted_mid_run_loses_nothing(short_tmp: Path, servers: list[Server],
                                                  durable_queue: str, server: Server) -> None:
    figures = through_a_restart(short_tmp, server, servers, source="rabbitmq", options={
        "url": AMQP_URL, "queue": durable_queue, "heartbeat": 5},
        handler="tests.brokers.handlers:JsonBody", publish=rabbit_publisher(durable_queue))
    assert rabbit_settled(durable_queue) == (0, 0)
    print(f"\n{server.name}: {figures}")


# -- Redis ------------------------------------------------------------------------------------

def test_redis_restarted_mid_run_loses_nothing(short_tmp: Path, servers: list[Server]) -> None:
    redis = pytest.importorskip("redis")
    stream = f"obtest-restart-{uuid.uuid4().hex[:10]}"

    def client() -> object:
        return redis.Redis.from_url("redis://127.0.0.1:6379/0")

    c = client()
    c.xgroup_create(stream, "pipeline", id="0", mkstream=True)

    def publish(start: int, stop: int) -> list[str]:
        r = client()
        pipe = r.pipeline(transaction=False)
        for i in range(start, stop):
            pipe.xadd(stream, {"seq": str(i), "fail": ""})
        return [i.decode() if isinstance(i, bytes) else i for i in pipe.execute()]

    try:
        figures = through_a_restart(short_tmp, Redis(), servers, source="redis", options={
            "url": "redis://127.0.0.1:6379/0", "stream": stream, "group": "pipeline",
            "create_group": False}, handler="tests.brokers.handlers:FieldMap",
            publish=publish)
        assert client().xpending(stream, "pipeline")["pending"] == 0
        print(f"\nredis: {figures}")
    finally:
        with contextlib.suppress(Exception):
            client().delete(stream, f"{stream}:dead")


# -- NATS -------------------------------------------------------------------------------------

# the default run restarts NATS in tests/brokers/test_pipeline_nats.py
@pytest.mark.slow
def test_nats_restarted_mid_run_loses_nothing(short_tmp: Path, servers: list[Server]) -> None:
    from tests.brokers.natsutil import NATS_URL, Jet

    setup = Jet()
    stream = setup.stream()
    setup.run(setup.nc.close())
    setup.loop.close()

    def publish_once(start: int, stop: int) -> list[str]:
        j = Jet()
        try:
            return j.publish(stream, [json.dumps({"seq": i}).encode()
                                      for i in range(start, stop)], start=start)
        finally:
            j.run(j.nc.close())
            j.loop.close()

    def publish(start: int, stop: int) -> list[str]:
        """JetStream answers a moment after the server does: retried for 30 s (the
        Nats-Msg-Id headers make a repeated publish a no-op)."""
        deadline = time.monotonic() + 30
        while True:
            try:
                return publish_once(start, stop)
            except (Exception, pytest.fail.Exception):   # Jet() fails the test when down
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    try:
        figures = through_a_restart(short_tmp, Nats(), servers, source="nats", options={
            "url": NATS_URL, "stream": stream, "ack_wait": 5},
            handler="tests.brokers.handlers:JsonBody", publish=publish)
        after = Jet()
        try:
            info = after.consumer(stream, "e2e")
            assert (info.num_pending, info.num_ack_pending) == (0, 0)
        finally:
            after.streams.append(stream)
            after.cleanup()
        print(f"\nnats: {figures}")
    finally:
        with contextlib.suppress(Exception):
            j = Jet()
            j.streams.append(stream)
            j.cleanup()
