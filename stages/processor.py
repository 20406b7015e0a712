"""The processor stage: ``prepare_messages`` and ``handle_message`` on every message.

It consumes from every producer (GenStage demand, see :mod:`.consumer`).  Without
batchers it acks each frame's messages to their producers as soon as they are handled;
with batchers it is a producer-consumer: healthy messages go on, partitioned by batcher
key, to the batchers that subscribe to it.  A callback that raises fails only the messages
concerned; the stage keeps running.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import zmq

from . import callbacks, protocol
from .acker import Acker
from .consumer import Subscriptions
from .dispatch import PartitionDispatcher
from .downstream import Downstream
from .spec import StageSpec
from .stage import Stage, load_handler

log = logging.getLogger("offbroadway.processor")

class ProcessorStage(Stage):
    def __init__(self, spec: StageSpec) -> None:
        super().__init__(spec)
        self.handler = load_handler(spec.handler)
        self.context = spec.context
        self.batchers = set(spec.batchers)
        # Output bound: past it we stop re-asking producers (back-pressure).
        self.out_limit = max(1000, 10 * spec.max_demand)
        self.out: list[list] = []
        self.subs = Subscriptions(spec.max_demand, spec.min_demand,
                                  can_ask=lambda: len(self.out) < self.out_limit)
        self.finished = False

    def setup(self) -> None:
        if self.batchers:
            self.downstream = Downstream(
                self, PartitionDispatcher(sorted(self.batchers), _batcher_of),
                on_change=self._on_demand)
        partition = self.spec.index if self.spec.partition_by else None
        for producer in self.spec.upstream:
            sock = self.dealer(producer)
            self.subs.add(producer, sock, partition)
            self.register(sock, self._on_upstream)
        self.acker = Acker([up.sock for up in self.subs.upstreams], self.handler,
                           self.context, self.counters)

    def stats(self) -> dict[str, Any]:
        s = super().stats()
        s["buffered"] = len(self.out)
        return s

    # -- upstream ---------------------------------------------------------------------------
    def _on_upstream(self, sock: zmq.Socket) -> None:
        up = self.subs.by_sock[sock]
        for _ in range(100):
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            msg = self.decode(frame, up.stage_id)
            if msg is None:
                continue
            if msg[0] == protocol.EVENTS:
                self._handle(msg[1])
                self.subs.consumed(up, len(msg[1]))
            elif msg[0] == protocol.CANCEL:
                self.subs.cancelled(up, msg[1])
        self._maybe_finish()

    def _handle(self, events: list) -> None:
        if not events:
            return
        self.counters["in"] += len(events)
        messages = [protocol.event_to_message(e) for e in events]
        started = time.perf_counter()
        done, failed = callbacks.process(self.handler, messages, self.context, self.batchers)
        self.metrics.observe("handle_message", (time.perf_counter() - started) / len(events))
        if self.batchers:
            if failed:
                self.acker.finish((), failed)
            if done:
                self.out.extend([protocol.message_to_event(m) for m in done])
                self._forward()
        else:
            self.acker.finish(done, failed)
        self.counters["out"] += len(done)

    # -- downstream (batchers) --------------------------------------------------------------
    def _on_demand(self) -> None:
        self._forward()
        self._maybe_finish()

    def _forward(self) -> None:
        if not self.out:
            return
        self.out, _sent = self.downstream.deliver(self.out, protocol.events)
        if len(self.out) < self.out_limit:
            self.subs.release()

    # -- shutdown cascade -------------------------------------------------------------------
    def _maybe_finish(self) -> None:
        if self.finished or not self.subs.all_done or self.out:
            return
        self.finished = True
        if self.batchers:
            self.downstream.cancel_all("shutdown")
        self.report("done", self.stats())   # final counts: the last tick may be older

    def cmd_resubscribe(self, producer: str) -> None:
        up = self.subs.find(producer)
        if up is not None and self.subs.resubscribe:
            self.subs.subscribe(up)

    def cmd_no_resubscribe(self) -> None:
        self.subs.resubscribe = False


def _batcher_of(event: list) -> str:
    return event[5]
