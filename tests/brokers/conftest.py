"""Fixtures for the broker tests: the real RabbitMQ and Redis of this machine.

Every test gets its own queue / stream names (so tests of other engineers running at the
same time on the same brokers are never touched) and removes them afterwards.  A broker
that does not answer fails the test with the command that starts it: CI (.ci/run) starts
both before the tests, so a skip would only hide a broken set-up.
"""

from __future__ import annotations

import contextlib
import select
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.conftest import wait_until

pika = pytest.importorskip("pika", reason="the brokers extra (pika) is not installed")
redis = pytest.importorskip("redis", reason="the brokers extra (redis) is not installed")

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
REDIS_URL = "redis://127.0.0.1:6379/0"


def unique(prefix: str) -> str:
    return f"obtest-{prefix}-{uuid.uuid4().hex[:10]}"


class Rabbit:
    """A test-side AMQP connection: declares, publishes and inspects, then cleans up."""

    def __init__(self) -> None:
        try:
            # no heartbeats: a test that waits minutes without driving this connection
            # (a JVM restart under load) would otherwise have it closed by the broker
            self.conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL + "?heartbeat=0"))
        except pika.exceptions.AMQPConnectionError as exc:
            pytest.fail(f"RabbitMQ is not answering at 127.0.0.1:5672 ({exc}); start it "
                        f"with `rabbitmq-server -detached`")
        self.ch = self.conn.channel()
        self.queues: list[str] = []
        self.exchanges: list[str] = []

    def queue(self, *, dlx: bool = False) -> str:
        """A fresh queue; with ``dlx`` its dead-letter exchange feeds ``<queue>.dlq``."""
        name = unique("q")
        args: dict[str, Any] = {}
        if dlx:
            exchange, dlq = f"{name}.dlx", f"{name}.dlq"
            self.ch.exchange_declare(exchange, "fanout", auto_delete=False)
            self.exchanges.append(exchange)
            self.ch.queue_declare(dlq)
            self.queues.append(dlq)
            self.ch.queue_bind(dlq, exchange)
            args["x-dead-letter-exchange"] = exchange
        self.ch.queue_declare(name, arguments=args or None)
        self.queues.append(name)
        return name

    def publish(self, queue: str, n: int, *, start: int = 0) -> list[str]:
        """n persistent-enough messages with message_id ``m<i>`` and body ``b"<i>"``."""
        ids = []
        for i in range(start, start + n):
            mid = f"m{i}"
            self.ch.basic_publish("", queue, str(i).encode(),
                                  pika.BasicProperties(message_id=mid, headers={"i": i}))
            ids.append(mid)
        return ids

    def ready(self, queue: str) -> int:
        """Ready messages, from the broker (passive declare)."""
        return self.ch.queue_declare(queue, passive=True).method.message_count

    def take_all(self, queue: str) -> list[str]:
        """Drain a queue with basic.get as a fresh consumer; returns the message ids."""
        out = []
        while True:
            method, props, _body = self.ch.basic_get(queue, auto_ack=True)
            if method is None:
                return out
            out.append(props.message_id)

    def connection_pid(self, connection_name: str) -> str | None:
        res = subprocess.run(["rabbitmqctl", "list_connections", "pid", "client_properties"],
                             capture_output=True, text=True, timeout=60, check=False)
        for line in res.stdout.splitlines():
            if f'{{"connection_name","{connection_name}"}}' in line:
                return line.split("\t", 1)[0]
        return None

    def close_connection(self, connection_name: str) -> None:
        """Close one client connection from the broker side (rabbitmqctl), as an operator
        or a broker restart would; never touches anyone else's connections."""
        pid = wait_until(lambda: self.connection_pid(connection_name), timeout=30,
                         interval=0.2, message=f"connection {connection_name!r} listed")
        subprocess.run(["rabbitmqctl", "-q", "close_connection", pid, "test: broker side"],
                       check=True, capture_output=True, timeout=60)

    def cleanup(self) -> None:
        for q in self.queues:
            try:
                self.ch.queue_delete(q)
            except pika.exceptions.AMQPError:
                self.ch = self.conn.channel()
        for e in self.exchanges:
            self.ch.exchange_delete(e)
        self.conn.close()


@pytest.fixture
def rabbit() -> Iterator[Rabbit]:
    r = Rabbit()
    yield r
    r.cleanup()


@pytest.fixture
def rq() -> Iterator[Any]:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        pytest.fail(f"Redis is not answering at 127.0.0.1:6379 ({exc}); start it with "
                    f"`redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 ...`")
    made: list[str] = []
    client.test_streams = made   # type: ignore[attr-defined]
    yield client
    for name in made:
        client.delete(name, f"{name}:dead")
    client.close()


@pytest.fixture
def sources() -> Iterator[Callable[[Any], Any]]:
    """Register sources to be closed at the end of the test, whatever happens."""
    opened: list[Any] = []

    def keep(src: Any) -> Any:
        opened.append(src)
        return src

    yield keep
    for src in opened:
        with contextlib.suppress(Exception):   # teardown must close the others
            src.close()


def consume(src: Any, count: int, on_items: Callable[[list], None], *, batch: int = 100,
            timeout: float = 60.0) -> int:
    """Drive a source as the producer does until ``count`` messages were fetched.

    Push sources: fetch until a short answer, then wait on ``fileno()`` (what the
    producer's poller does).  Pull sources: wait ``retry_after()`` (the producer's timer).
    """
    deadline = time.monotonic() + timeout
    got = 0
    fd = src.fileno()
    while got < count:
        items = src.fetch(min(batch, count - got))
        if items:
            got += len(items)
            on_items(items)
            continue
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s: fetched {got} of {count}; "
                                 f"source stats {src.stats()}")
        if fd is not None:
            select.select([fd], [], [], 0.2)
        else:
            time.sleep(min(src.retry_after(), 0.2))
    return got


def consume_until(src: Any, done: Callable[[], bool], on_items: Callable[[list], None], *,
                  batch: int = 100, timeout: float = 60.0) -> None:
    """Like :func:`consume`, until ``done()`` holds (checked whenever a fetch is short)."""
    deadline = time.monotonic() + timeout
    fd = src.fileno()
    while True:
        items = src.fetch(batch)
        if items:
            on_items(items)
            continue
        if done():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s; source stats {src.stats()}")
        if fd is not None:
            select.select([fd], [], [], 0.2)
        else:
            time.sleep(min(src.retry_after(), 0.2))


class TcpProxy:
    """A loopback TCP proxy to a broker that a test can take down and bring back.

    It stands in for "the server restarted" or "the network dropped" without touching the
    shared server other tests use: ``down()`` drops every proxied connection at once and
    refuses new ones; ``up()`` accepts again on the same port.
    """

    def __init__(self, upstream_port: int) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._listener: socket.socket | None = None
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.up()

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            socks, self._socks = self._socks, []
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._socks += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        peer = {a: b, b: a}
        try:
            while True:
                readable, _, _ = select.select([a, b], [], [], 1.0)
                for s in readable:
                    data = s.recv(65536)
                    if not data:
                        return
                    peer[s].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()


@pytest.fixture
def jet() -> Iterator[Any]:
    """The machine's NATS JetStream server (4222); streams made through it are deleted."""
    from tests.brokers.natsutil import Jet

    j = Jet()
    yield j
    j.cleanup()


@pytest.fixture
def own_nats(tmp_path: Any) -> Iterator[Any]:
    """A nats-server of this test's own (free port, store under tmp_path) that the test
    may kill and restart; the shared server is never touched."""
    from tests.brokers.natsutil import NatsServer

    store = tmp_path / "nats-store"
    store.mkdir()
    server = NatsServer(store)
    yield server
    server.stop()
