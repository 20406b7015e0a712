"""The consumer half shared by processors, batchers and batch processors.

GenStage's automatic demand, per upstream producer: subscribe, ask ``max_demand``, and
after handling ``max_demand - min_demand`` events from that producer ask for that many
again.  A stage may hold back re-asking (``can_ask``) when its own output is backed up:
that is how back-pressure reaches the source.

An upstream that cancels with "shutdown" is done; when every upstream is done the stage
flushes (``on_upstream_done``).  An upstream that restarted (it answers an ask with
"unknown subscription", or the daemon says so) is subscribed to afresh.
"""

from __future__ import annotations

from collections.abc import Callable

import zmq

from . import protocol


class Upstream:
    __slots__ = ("consumed", "done", "partition", "sock", "stage_id")

    def __init__(self, stage_id: str, sock: zmq.Socket, partition) -> None:
        self.stage_id = stage_id
        self.sock = sock
        self.consumed = 0      # events handled since the last ask
        self.done = False
        self.partition = partition


class Subscriptions:
    """The upstream side of one consumer stage."""

    def __init__(self, max_demand: int, min_demand: int,
                 can_ask: Callable[[], bool] = lambda: True) -> None:
        self.max_demand = max_demand
        self.ask_every = max(1, max_demand - min_demand)
        self.can_ask = can_ask
        self.upstreams: list[Upstream] = []
        self.by_sock: dict[zmq.Socket, Upstream] = {}
        self.resubscribe = True

    def add(self, stage_id: str, sock: zmq.Socket, partition=None) -> Upstream:
        up = Upstream(stage_id, sock, partition)
        self.upstreams.append(up)
        self.by_sock[sock] = up
        self.subscribe(up)
        return up

    def subscribe(self, up: Upstream) -> None:
        up.consumed = 0
        up.done = False
        min_demand = self.max_demand - self.ask_every
        up.sock.send(protocol.subscribe(self.max_demand, min_demand, up.partition), zmq.NOBLOCK)
        up.sock.send(protocol.ask(self.max_demand), zmq.NOBLOCK)

    def consumed(self, up: Upstream, n: int) -> None:
        up.consumed += n
        if up.consumed >= self.ask_every and self.can_ask():
            up.sock.send(protocol.ask(up.consumed), zmq.NOBLOCK)
            up.consumed = 0

    def release(self) -> None:
        """Output drained: send the asks that back-pressure held back."""
        for up in self.upstreams:
            if up.consumed >= self.ask_every and not up.done:
                up.sock.send(protocol.ask(up.consumed), zmq.NOBLOCK)
                up.consumed = 0

    def cancelled(self, up: Upstream, reason: str) -> None:
        if reason == "unknown subscription":
            if self.resubscribe:
                self.subscribe(up)
        else:
            up.done = True

    def find(self, stage_id: str) -> Upstream | None:
        for up in self.upstreams:
            if up.stage_id == stage_id:
                return up
        return None

    @property
    def all_done(self) -> bool:
        return all(up.done for up in self.upstreams)
