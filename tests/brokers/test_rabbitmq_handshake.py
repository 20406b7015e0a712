"""A broker that closes the connection before the AMQP handshake (a node still booting, a
load balancer with no backend, a listener at its connection limit) is retried like an
unreachable one, at start and later: a real listener that accepts and closes at once
stands on the port, then the real broker takes it over through a proxy."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections import Counter
from typing import Any

import pytest

from tests.brokers.conftest import Rabbit, TcpProxy, consume_until
from tests.brokers.test_rabbitmq_source import ack_all, make, settled
from tests.conftest import wait_until

pytestmark = pytest.mark.broker


class ClosingListener:
    """Accepts every connection and closes it before a byte is exchanged."""

    def __init__(self, port: int) -> None:
        self.accepted = 0
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self._sock.listen(16)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def test_a_connection_closed_before_the_handshake_is_retried(rabbit: Rabbit,
                                                              sources: Any) -> None:
    q = rabbit.queue()
    ids = rabbit.publish(q, 200)
    proxy = TcpProxy(5672)
    proxy.down()
    closing = ClosingListener(proxy.port)
    try:
        # at start: open() must not fail, only retry
        src = make(q, sources, url=f"amqp://guest:guest@127.0.0.1:{proxy.port}/%2F",
                   backoff_min=0.02, backoff_max=0.2, connect_timeout=2)
        wait_until(lambda: closing.accepted >= 3, timeout=20, message="three attempts")
        stats = src.stats()
        assert stats["state"] in ("reconnecting", "connecting"), stats
        assert stats["last_error"], stats
        closing.close()
        proxy.up()
        seen: Counter = Counter()
        consume_until(src, lambda: len(seen) >= 100, ack_all(src, seen), timeout=60)
        # later: the same fault after the source has run
        proxy.down()
        wait_until(lambda: src.stats()["state"] != "connected", timeout=20,
                   message="the drop noticed")
        closing = ClosingListener(proxy.port)
        wait_until(lambda: closing.accepted >= 2, timeout=20, message="retried while closed")
        closing.close()
        proxy.up()
        consume_until(src, lambda: set(seen) == set(ids) and settled(src) and src.exhausted(),
                      ack_all(src, seen), timeout=60)
        src.close()
        assert rabbit.ready(q) == 0
    finally:
        closing.close()
        proxy.down()
