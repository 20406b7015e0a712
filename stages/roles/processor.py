"""The processor stage: ``prepare_messages`` and ``handle_message`` on every message.

It consumes from every producer with one demand budget (:mod:`.consumer`,
:mod:`.demand`).  Frames are read into an inbox before they are handled, so that with long
jobs it can look at everything already received and give back (RETURN) what another
processor should start instead of queueing it behind the current job.  Without
batchers it acks each frame's messages to their producers as soon as they are handled;
with batchers it is a producer-consumer: healthy messages go on, partitioned by batcher
key, to the batchers that subscribe to it.  A callback that raises fails only the messages
concerned; the stage keeps running.  When every producer has cancelled (the drain) or it
leaves (a resize), it forwards what it holds and finishes (:mod:`.consumer_stage`): it
cancels its batchers, or, without batchers, reports ``done``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from operator import attrgetter
from typing import Any

import zmq
from offbroadway import Message

from ..flow.dispatch import PartitionDispatcher
from ..poison import blame
from ..runtime import callbacks
from ..runtime.handler import load_handler
from ..runtime.spec import StageSpec
from ..runtime.stage import ZmqIO
from ..wire import protocol
from ..wire.values import split_unsendable
from .acker import Acker
from .consumer import Subscriptions, Upstream
from .consumer_stage import ConsumerStage
from .downstream import Downstream

log = logging.getLogger("offbroadway.processor")

#: where a processor's healthy messages go (said in the reason of one that cannot)
ONWARD = "on to the batcher"


class ProcessorStage(ConsumerStage):
    def __init__(self, spec: StageSpec, io: ZmqIO | None = None) -> None:
        super().__init__(spec, io)
        self.handler = load_handler(spec.handler)
        self.context = spec.context
        self.batchers = set(spec.batchers)
        # Output bound: past it we stop re-asking producers (back-pressure).
        self.out_limit = max(1000, 10 * spec.max_demand)
        #: handled messages waiting for batcher demand (built once, encoded when sent), as
        #: the frames' lists they were handled in: a delivery takes whole lists from the
        #: front and slices at most one, so a message waiting here is never copied from
        #: list to list (each copy touches every message's reference count, thousands of
        #: cold cache lines per delivery when batchers ask for less than is waiting)
        self.out: deque[list[Message]] = deque()
        #: how many messages ``out`` holds
        self.held_out = 0
        self.subs = Subscriptions(spec.max_demand, spec.min_demand,
                                  can_ask=lambda: self.held_out < self.out_limit,
                                  budget=True, index=spec.index, call_later=self.call_later,
                                  counters=self.counters)
        #: messages the handler discarded (Message.discard) and this stage acked at once
        self.counters["discarded"] = 0
        self.counters["unsendable"] = 0
        #: frames received and not yet handled: (upstream, events, counted by the budget,
        #: the frame's header: status and batch key, and its events packed, for the blame
        #: record)
        self.inbox: deque[tuple[Upstream, list, bool, tuple]] = deque()

    def setup(self) -> None:
        if self.batchers:
            self.downstream = Downstream(
                self, PartitionDispatcher(sorted(self.batchers), attrgetter("batcher")),
                on_change=self._on_demand)
        partition = self.spec.index if self.spec.partition_by else None
        for producer in self.spec.upstream:
            sock = self.dealer(producer)
            self.subs.add(producer, sock, partition)
            self.register(sock, self._on_upstream)
        self.acker = Acker([up.sock for up in self.subs.upstreams], self.handler,
                           self.context, self.counters, self.failures)
        # what runs right now, for the daemon to read if this process dies of it (poison)
        self.blame = blame.BlameRecorder(blame.path(self.spec.runtime_dir, self.id))

    def teardown(self) -> None:
        self.blame.close()

    def stats(self) -> dict[str, Any]:
        s = super().stats()
        s["buffered"] = self.held_out
        s["out_limit"] = self.out_limit     # the back-pressure bound (tests derive from it)
        s.update(self.subs.stats())
        return s

    # -- upstream ---------------------------------------------------------------------------
    def _on_upstream(self, sock: zmq.Socket) -> None:
        self._read(self.subs.by_sock[sock])
        inbox = self.inbox
        while inbox:
            if self.subs.sheds():
                # long jobs: look at everything already here before starting the next one
                # and give back what another processor should start instead
                self._gather(self.subs.gather_for())
                self.subs.shed(inbox)
                if not inbox:
                    break
            up, events, budgeted, header = inbox.popleft()
            started = time.perf_counter()
            self._handle(events, *header)
            self.subs.consumed(up, len(events), time.perf_counter() - started, budgeted)
        self.maybe_finish()

    def _gather(self, wait: float) -> None:
        """Read every upstream, and with ``wait`` go on reading for that many seconds (a
        wake from idle: events racing our busy report)."""
        ups = self.subs.upstreams
        for up in ups:
            self._read(up)
        deadline = time.monotonic() + wait
        while (left := deadline - time.monotonic()) > 0:
            if self.io.readable([up.sock for up in ups], left):
                for up in ups:
                    self._read(up)

    def _read(self, up: Upstream) -> None:
        """A burst of frames from ``up``: events to the inbox (the subscriptions are told
        they arrived), anything else to the subscriptions."""
        for msg in self.frames(up.sock, up.stage_id):
            if msg[protocol.KIND_AT] == protocol.EVENTS:
                events = self.open_events(msg[protocol.EVENTS_PACKED], up.stage_id)
                if events is not None:
                    self.inbox.append((up, events, self.subs.received(up, len(events)),
                                       (msg[protocol.EVENTS_STATUS], msg[protocol.EVENTS_BATCH_KEY],
                                        msg[protocol.EVENTS_PACKED])))
            else:
                self.subs.on_frame(up, msg)

    def open_events(self, packed: bytes, peer: str) -> protocol.ev.Block | None:
        """A frame's events, or None (counted and dropped) when they are malformed."""
        try:
            return protocol.open_events(packed)
        except protocol.ProtocolError as exc:
            self.counters["malformed"] += 1
            log.warning("%s: dropped malformed events from %s: %s", self.id, peer, exc)
            return None

    def _handle(self, events: protocol.ev.Block, status: str | None, batch_key: Any,
                packed: bytes) -> None:
        if not events:
            return
        self.counters["in"] += len(events)
        messages = protocol.to_messages(events, status, protocol.DEFAULT, batch_key)
        # the frame goes into the blame record once; each message then records its place
        # (events shed from the frame's end leave the front's places as they were)
        self.blame.events(packed, messages)
        started = time.perf_counter()
        done, failed, discarded = callbacks.process(self.handler, messages, self.context,
                                                    self.batchers, self.blame,
                                                    healthy=status is None)
        self.metrics.observe("handle_message", (time.perf_counter() - started) / len(events),
                             count=len(events))
        if self.batchers:
            if failed or discarded:
                # discarded (Message.discard): acked now, as done; they go to no batcher
                self.acker.finish(discarded, failed)
                self.counters["discarded"] += len(discarded)
            if done:
                self.out.append(done)
                self.held_out += len(done)
                self._forward()
        else:
            self.acker.finish(done, failed)
        self.counters["out"] += len(done)

    # -- downstream (batchers) --------------------------------------------------------------
    def _on_demand(self) -> None:
        self._forward()
        self.maybe_finish()

    def _forward(self) -> None:
        out = self.out
        if not out:
            return
        dispatcher = self.downstream.dispatcher
        kept: list[list[Message]] = []
        while out and dispatcher.demand > 0:
            left, _sent = self.downstream.deliver_frames(out.popleft(), self._frames)
            if left:
                kept.append(left)     # no demand for their batcher yet: first in line
        if kept:
            out.extendleft(reversed(kept))
        self.held_out = sum(map(len, out))
        if self.held_out < self.out_limit:
            self.subs.release()

    def _frames(self, share: list[Message]) -> list[tuple[bytes, list[Message]]]:
        """A batcher's share as frames; a message whose data the codec cannot carry (a
        handler returned a set, an object…) fails alone, here, and the rest go on.  Its
        reason names the value; it is logged with the other failures of that reason in
        one aggregate line (:class:`~..runtime.failures.FailureTally`), not per message."""
        try:
            return _frames(share)
        except Exception:  # the codec raises TypeError, ValueError, OverflowError
            pass
        kept, bad = split_unsendable(share, ONWARD)
        self.counters["unsendable"] += len(bad)
        self.acker.finish((), bad)
        return _frames(kept) if kept else []

    # -- the consumer cascade (:mod:`.consumer_stage`) ----------------------------------------
    def holding(self) -> bool:
        """Handled messages still wait for the batchers' demand."""
        return bool(self.out)


def _frames(share: list[Message]) -> list[tuple[bytes, list[Message]]]:
    """A batcher's share as EVENTS frames, one per run of messages with the same batch key
    (usually one: the key is said once per frame)."""
    first = share[0].batch_key
    keys = [m.batch_key for m in share]
    if keys.count(first) == len(keys):
        runs = [(first, share)]
    else:
        runs = []
        start = 0
        for i in range(1, len(share) + 1):
            if i == len(share) or keys[i] != keys[start]:
                runs.append((keys[start], share[start:i]))
                start = i
    out: list[tuple[bytes, list[Message]]] = []
    for key, run in runs:
        out.extend(protocol.frames_within_limit(
            run, lambda ms, key=key: protocol.message_events(ms, key)))
    return out
