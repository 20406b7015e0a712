"""Sockets without ZeroMQ, for building a stage role and driving it frame by frame.

A stage takes every socket from its I/O object (:class:`offbroadway.stages.runtime.stage.
ZmqIO`); :class:`FakeIO` hands out :class:`FakeSocket` instead, which keeps what the stage
sends and gives back what a test queued.  The role's own code runs unchanged: the frame
handlers read with ``get(EVENTS)``/``recv`` and answer with ``send`` as in a process."""

from __future__ import annotations

from collections import deque
from typing import Any

import zmq
from offbroadway.stages.wire import protocol


class FakeSocket:
    """One socket: ``inbox`` is what the stage will read, ``sent`` what it sent."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.inbox: deque[Any] = deque()
        self.sent: list[Any] = []
        self.closed = False

    # what a test does
    def push(self, *parts: bytes) -> None:
        """Queue a frame for the stage (a ROUTER's: ``peer, frame``)."""
        self.inbox.append(parts[0] if len(parts) == 1 else list(parts))

    def take(self) -> list[list]:
        """The frames sent since the last take, decoded (a ROUTER's as ``[peer, msg]``)."""
        out = [[p[0], protocol.decode(p[1])] if isinstance(p, list) else protocol.decode(p)
               for p in self.sent]
        self.sent.clear()
        return out

    # what the stage does
    def send(self, frame: bytes, flags: int = 0) -> None:
        self.sent.append(frame)

    def send_multipart(self, parts: list[bytes], flags: int = 0) -> None:
        self.sent.append(list(parts))

    def recv(self, flags: int = 0) -> bytes:
        if not self.inbox:
            raise zmq.Again()
        return self.inbox.popleft()

    def recv_multipart(self, flags: int = 0) -> list[bytes]:
        if not self.inbox:
            raise zmq.Again()
        return self.inbox.popleft()

    def get(self, option: int) -> int:
        assert option == protocol.ZMQ_EVENTS
        return protocol.ZMQ_POLLIN if self.inbox else 0

    def close(self, linger: int | None = None) -> None:
        self.closed = True


class FakeIO:
    """A stage's I/O with fake sockets, found by the stage id they lead to."""

    def __init__(self) -> None:
        self.hub_sock: FakeSocket | None = None
        self.router_sock: FakeSocket | None = None
        #: the DEALERs, by the stage id (the socket name) they connect to
        self.dealers: dict[str, FakeSocket] = {}
        self.watched: set[Any] = set()

    @staticmethod
    def _name(address: str) -> str:
        return address.rsplit("/", 1)[-1].removesuffix(".sock")

    def hub(self, identity: bytes, address: str) -> FakeSocket:
        self.hub_sock = FakeSocket("hub")
        return self.hub_sock

    def router(self, address: str) -> FakeSocket:
        self.router_sock = FakeSocket(self._name(address))
        return self.router_sock

    def dealer(self, identity: bytes, address: str) -> FakeSocket:
        sock = self.dealers[self._name(address)] = FakeSocket(self._name(address))
        return sock

    def watch(self, sock_or_fd: Any) -> None:
        self.watched.add(sock_or_fd)

    def unwatch(self, sock: Any) -> None:
        self.watched.discard(sock)

    def poll(self, timeout_ms: float) -> list:
        return []

    def readable(self, socks: list[FakeSocket], timeout: float) -> list[FakeSocket]:
        return [s for s in socks if s.inbox]

    def destroy(self, linger_ms: int) -> None:
        pass

    def close(self) -> None:
        pass


def subscribed_batcher(tmp_path: Any, ask: int) -> tuple[Any, FakeSocket, FakeSocket]:
    """A batcher of 3-message batches, set up on fake sockets, with one batch processor
    subscribed that asked for ``ask`` batches: (the stage, its ROUTER, its upstream)."""
    from offbroadway.stages.roles.batcher import BatcherStage
    from offbroadway.stages.runtime.spec import StageSpec

    spec = StageSpec("batcher_default", "batcher", "t", str(tmp_path), batcher="default",
                     upstream=("processor_default_0",), consumer_count=1, batch_size=3,
                     batch_timeout=60.0, max_demand=10, min_demand=5)
    io = FakeIO()
    stage = BatcherStage(spec, io)
    stage.setup()
    router, up = io.router_sock, io.dealers["processor_default_0"]
    router.push(b"batch_processor_default_0", protocol.subscribe(2, 1, None, 1))
    router.push(b"batch_processor_default_0", protocol.ask(ask))
    stage.downstream._on_frames(router)
    return stage, router, up
