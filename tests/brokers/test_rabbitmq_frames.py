"""The rabbitmq source's own delivery decoder (``frames.py``) against the real broker:
bodies over several frames, a large headers table and every property (metadata exactly as
pika's objects give it), a connection cut in the middle of a body frame, and a corrupt
frame from the wire (one warning line, a reconnect, nothing lost)."""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import struct
import threading
import time
from collections import Counter
from datetime import datetime
from decimal import Decimal
from typing import Any

import pika
import pytest
from offbroadway.stages.sources.rabbitmq.delivery import to_item

from tests.brokers.conftest import Rabbit, TcpProxy, consume, consume_until, unique
from tests.brokers.test_rabbitmq_source import ack_all, make, settled
from tests.conftest import wait_until

pytestmark = pytest.mark.broker

FRAME_BODY_MAX = 131072 - 8      # RabbitMQ's default frame_max, less header and end


def body_of(i: int, size: int) -> bytes:
    seed = f"<{i}>".encode()
    return (seed * (size // len(seed) + 1))[:size]


def test_bodies_over_several_frames(rabbit: Rabbit, sources: Any) -> None:
    q = rabbit.queue()
    sizes = [0, 1, FRAME_BODY_MAX, FRAME_BODY_MAX + 1, 3 * FRAME_BODY_MAX, 1_000_003]
    for i, size in enumerate(sizes):
        rabbit.ch.basic_publish("", q, body_of(i, size),
                                pika.BasicProperties(message_id=f"m{i}"))
    src = make(q, sources, prefetch_count=3)
    items: list = []
    consume(src, len(sizes), lambda got: (items.extend(got), src.ack([h for *_, h in got])))
    assert sorted(len(body) for _m, body, _meta, _h in items) == sorted(sizes)
    for msg_id, body, meta, _h in items:
        i = int(msg_id[1:])
        assert body == body_of(i, sizes[i]) and meta["message_id"] == msg_id
        assert meta["redelivered"] is False and meta["queue"] == q
    wait_until(lambda: settled(src) and src.stats()["acked"] == len(sizes), timeout=20,
               message="all acked")


def test_large_headers_and_every_property_as_pika_gives_them(rabbit: Rabbit,
                                                             sources: Any) -> None:
    """One message into two queues: the source decodes it from one, pika (basic.get)
    from the other; the items are the same but for the queue and the delivery tag."""
    exchange = unique("fan")
    rabbit.ch.exchange_declare(exchange, "fanout", auto_delete=False)
    rabbit.exchanges.append(exchange)
    q, twin = rabbit.queue(), rabbit.queue()
    for name in (q, twin):
        rabbit.ch.queue_bind(name, exchange)
    headers: dict[str, Any] = {f"h{i}": "v" * 40 for i in range(2000)}   # ~100 KB
    headers.update({"when": datetime(2026, 1, 2, 3, 4, 5), "big": 2**62,
                    "price": Decimal("12.50"), "nested": {"list": [1, "a", True]},
                    "raw": b"\x00\xff", "none": None})
    full = pika.BasicProperties(
        content_type="application/json", content_encoding="utf-8", headers=headers,
        delivery_mode=2, priority=3, correlation_id="corr", reply_to="back",
        expiration="600000", message_id="full-1", timestamp=1_700_000_000, type="order",
        user_id="guest", app_id="tests")
    rabbit.ch.basic_publish(exchange, "rk.full", b'{"a": 1}', full)
    rabbit.ch.basic_publish(exchange, "rk.bare", b"bare")             # no property at all
    src = make(q, sources, prefetch_count=10)
    items: list = []
    consume(src, 2, items.extend)
    for msg_id, body, meta, handle in items:
        method, props, twin_body = rabbit.ch.basic_get(twin, auto_ack=True)
        expected = to_item(method, props, twin_body, q, handle.incarnation,
                           src._io._session, src.settings.max_message_bytes)
        if props.message_id is not None:
            assert msg_id == expected[0] == props.message_id
        else:                                   # "<delivery tag>@<session>.<incarnation>"
            assert msg_id == f"{handle.tag}@{src._io._session}.{handle.incarnation}"
        assert body == expected[1]
        del meta["delivery_tag"], expected[2]["delivery_tag"]
        assert meta == expected[2]
        assert handle._replace(tag=0) == expected[3]._replace(tag=0)
    full_meta = items[0][2]
    assert full_meta["headers"]["when"] == 1767323045
    assert full_meta["headers"]["price"] == "12.5"      # as pika decodes it
    assert len(full_meta["headers"]) == 2006 and full_meta["routing_key"] == "rk.full"
    assert set(items[1][2]) == {"queue", "routing_key", "exchange", "delivery_tag",
                                "redelivered"} - {"delivery_tag"}
    src.ack([h for *_, h in items])


class FrameProxy(TcpProxy):
    """A :class:`TcpProxy` that reads the broker's frames as they pass and, once armed,
    either cuts the connection 100 bytes into the next body frame's payload (``cut``) or
    spoils that frame's end marker (``corrupt``)."""

    def __init__(self, upstream_port: int) -> None:
        self.action: str | None = None
        self.done = threading.Event()
        super().__init__(upstream_port)

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:   # type: ignore[override]
        peer = {a: b, b: a}
        head, left, ftype, size = b"", 0, 0, 0
        try:
            while True:
                readable, _, _ = select.select([a, b], [], [], 1.0)
                for s in readable:
                    data = s.recv(65536)
                    if not data:
                        return
                    if s is not b or self.action is None:
                        peer[s].sendall(data)
                        if s is b:       # keep the cursor on the broker's frames
                            head, left, ftype, size, _ = _walk(data, head, left, ftype,
                                                                size, None)
                        continue
                    head, left, ftype, size, at = _walk(data, head, left, ftype, size,
                                                        self.action)
                    if at is None:
                        peer[s].sendall(data)
                    elif self.action == "cut":
                        peer[s].sendall(data[:at])
                        self.action = None
                        self.done.set()
                        return                                  # both sockets closed
                    else:
                        peer[s].sendall(data[:at] + b"\x00" + data[at + 1:])
                        self.action = None
                        self.done.set()
        except (OSError, ValueError):
            return
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()


def _walk(data: bytes, head: bytes, left: int, ftype: int, size: int,
          action: str | None) -> tuple[bytes, int, int, int, int | None]:
    """Advance a frame cursor over ``data``; the offset the action applies at, if any:
    100 bytes into a large body frame's payload (cut) or that frame's end marker."""
    i, at = 0, None
    while i < len(data):
        if left == 0:
            take = data[i:i + 7 - len(head)]
            head += take
            i += len(take)
            if len(head) == 7:
                ftype, _ch, size = struct.unpack(">BHI", head)
                head, left = b"", size + 1
            continue
        take = min(left, len(data) - i)
        offset = size + 1 - left                       # into the payload (+ end marker)
        if at is None and action and ftype == 3 and size > 1000:
            target = 100 if action == "cut" else size  # size: the end marker
            if offset <= target < offset + take:
                at = i + target - offset
        left -= take
        i += take
    return head, left, ftype, size, at


@pytest.mark.parametrize("action", ["cut", "corrupt"])
def test_a_connection_broken_inside_a_frame(rabbit: Rabbit, sources: Any, action: str,
                                            caplog: Any) -> None:
    """``cut``: the network drops 100 bytes into a body frame; ``corrupt``: a body frame
    arrives with a wrong end marker.  Either way the half-read delivery never becomes an
    item, the source says so in one warning line and reconnects, and every message
    arrives whole, once unless the broker redelivered it (flagged ``redelivered``)."""
    q = rabbit.queue()
    n, size = 30, 200_000                                   # two body frames each
    for i in range(n):
        rabbit.ch.basic_publish("", q, body_of(i, size),
                                pika.BasicProperties(message_id=f"m{i}"))
    proxy = FrameProxy(5672)
    try:
        src = make(q, sources, url=f"amqp://guest:guest@127.0.0.1:{proxy.port}/%2F",
                   prefetch_count=4, backoff_min=0.02, backoff_max=0.2)
        seen: Counter = Counter()
        fresh: Counter = Counter()

        def check(items: list) -> None:
            for msg_id, body, meta, _h in items:
                assert body == body_of(int(msg_id[1:]), size), msg_id
                if not meta["redelivered"]:
                    fresh[msg_id] += 1
            ack_all(src, seen)(items)

        consume(src, 8, check, batch=4)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="offbroadway"):
            proxy.action = action
            consume_until(src, lambda: proxy.done.is_set() and src.stats()["reconnects"] == 1
                          and src.stats()["state"] == "connected", check, timeout=30)
            consume_until(src, lambda: set(seen) == {f"m{i}" for i in range(n)}
                          and settled(src) and src.exhausted(), check, timeout=60)
        lost = [r for r in caplog.records if "connection to" in r.getMessage()]
        assert len(lost) == 1 and lost[0].exc_info is None
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        if action == "corrupt":
            assert "malformed AMQP frame" in lost[0].getMessage()
            assert "does not end with the frame-end marker" in src.stats()["last_error"]
        assert max(fresh.values()) == 1                     # nothing delivered new twice
        src.close()
        assert rabbit.ready(q) == 0 and rabbit.take_all(q) == []
    finally:
        proxy.down()


@pytest.mark.slow
def test_heartbeats_still_seen_while_idle_and_while_busy(rabbit: Rabbit, sources: Any) -> None:
    """pika's heartbeat checker watches the count of bytes received, which pika's own
    frame reader kept; the decoder reads the socket in its place and must keep it, or
    pika drops a healthy connection at its second check (heartbeat 1 s: checks every
    6 s).  So: 13 s idle (the broker's heartbeats only), then 3 s of deliveries."""
    q = rabbit.queue()
    src = make(q, sources, heartbeat=1, prefetch_count=50)
    seen: Counter = Counter()
    start = time.monotonic()
    i = 0
    while time.monotonic() < start + 16.0:
        if time.monotonic() > start + 13.0:
            rabbit.publish(q, 20, start=i)
            i += 20
        ack_all(src, seen)(src.fetch(100))
        assert src.stats()["reconnects"] == 0 and src.stats()["state"] == "connected", \
            src.stats()["last_error"]
        time.sleep(0.05)                        # the publishing pace, not a wait for state
    consume_until(src, lambda: len(seen) == i and settled(src), ack_all(src, seen))
    assert src.stats()["reconnects"] == 0 and max(seen.values()) == 1
