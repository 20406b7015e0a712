"""The producer stage: wraps a source, dispatches on demand, keeps the in-flight table.

Every message it emits gets a token and an in-flight entry (token → the source's handle)
until an ACK names it.  Acks come straight from whichever stage finished the message.
When the daemon reports that a stage downstream died, everything still in flight is handed
back to the source (``requeue``): at-least-once, so a SIGKILL anywhere loses nothing.

Tokens start at the incarnation's start time in nanoseconds, so an ack for a message of a
previous incarnation can never name a message of this one.
"""

from __future__ import annotations

import logging
import time
import zlib
from typing import Any

from . import protocol
from .dispatch import (
    Dispatcher,
    GenStageDemandDispatcher,
    PartitionDispatcher,
    SpreadDispatcher,
)
from .downstream import Downstream
from .inflight import InFlightTable
from .sources import get_source
from .spec import StageSpec
from .stage import Stage, load_handler

log = logging.getLogger("offbroadway.producer")


class ProducerStage(Stage):
    def __init__(self, spec: StageSpec) -> None:
        super().__init__(spec)
        source_cls = get_source(spec.source)
        self.source = source_cls(spec.source_options, pipeline=spec.pipeline,
                                 producer_index=spec.index, producer_count=spec.producer_count,
                                 state_dir=spec.state_dir)
        if spec.partition_by:
            handler = load_handler(spec.handler)
            route = getattr(handler, spec.partition_by)
            n = spec.consumer_count

            def key(event: list) -> int:
                return _stable_hash(route(protocol.event_to_message(event))) % n

            self.dispatcher: Dispatcher = PartitionDispatcher(range(n), key)
        elif spec.dispatcher == "demand":
            self.dispatcher = GenStageDemandDispatcher()
        else:
            self.dispatcher = SpreadDispatcher(offset=spec.index)
        self.inflight: InFlightTable = InFlightTable()
        self.buffer: list[list] = []
        self._acks: list = []
        self._fails: list = []
        self.next_token = time.time_ns()
        self.draining = False
        self.paused = False
        self._retry_pending = False
        self._idle: bool | None = None
        self._settled_reported = False
        self.counters.update(requeued=0, unknown_acks=0, returned=0, stale_returns=0)

    # -- lifecycle ------------------------------------------------------------------------------
    def setup(self) -> None:
        self.source.open()
        self.downstream = Downstream(self, self.dispatcher, self._on_frame, self._on_burst,
                                     self._on_return)
        fd = self.source.fileno()
        if fd is not None:
            self.register_fd(fd, self.pump)
        self.call_later(0.2, self._watch_idle)

    def teardown(self) -> None:
        try:
            self.source.close()
        except Exception:
            log.exception("%s: closing the source failed", self.id)

    def stats(self) -> dict[str, Any]:
        s = super().stats()
        s.update(inflight=len(self.inflight), buffered=len(self.buffer),
                 demand=self.dispatcher.demand, draining=self.draining, paused=self.paused,
                 source=self.source.stats())
        return s

    # -- frames from consumers ------------------------------------------------------------------
    def _on_frame(self, peer: bytes, msg: list) -> None:
        if msg[0] == protocol.ACK:
            # settled once per burst of frames: the source's durable write (an fsync for
            # the spool) is per call, so one call for many frames
            self._acks.extend(msg[1])
            self._fails.extend(msg[2])

    def _on_burst(self) -> None:
        if self._acks or self._fails:
            self._settle(self._acks, self._fails)
            self._acks, self._fails = [], []
        self.pump()

    def _on_return(self, peer: bytes, events: list) -> None:
        """A consumer gives back events it will not start soon: first in line again (the
        burst's pump dispatches them).  Only our own events still in flight and not
        already waiting here are taken: anything else is a stale or broken frame."""
        index, inflight = self.spec.index, self.inflight
        waiting = {ev[1] for ev in self.buffer}
        back = []
        for ev in events:
            token = ev[1]
            if ev[0] == index and token in inflight and token not in waiting:
                waiting.add(token)
                back.append(ev)
        # stale: given back after a requeue already handed them to the source again
        self.counters["returned"] += len(back)
        self.counters["stale_returns"] += len(events) - len(back)
        if back:
            self.buffer = back + self.buffer

    def _settle(self, ok: list, failed: list) -> None:
        handles, failures = self.inflight.settle(ok, failed)
        self.counters["unknown_acks"] = self.inflight.unknown
        if handles:
            self.source.ack(handles)
            self.counters["acked"] += len(handles)
        if failures:
            self.source.fail(failures)
            self.counters["failed"] += len(failures)

    # -- moving events --------------------------------------------------------------------------
    def pump(self) -> None:
        """Dispatch what is buffered, then fetch as much as there is demand for."""
        if self.buffer:
            self.buffer = self._dispatch(self.buffer)
        if self.draining or self.paused:
            self._maybe_cancel_consumers()
            return
        want = self.dispatcher.demand - len(self.buffer)
        if want <= 0:
            if self.source.fileno() is not None:
                self.source.fetch(0)   # clears a push source's wake-up: no level-triggered spin
            return
        items = self.source.fetch(want)
        if items:
            self.counters["in"] += len(items)
            self.buffer.extend(self._to_events(items))
            self.buffer = self._dispatch(self.buffer)
        if len(items) < want and self.source.fileno() is None and not self._retry_pending:
            self._retry_pending = True
            self.call_later(self.source.retry_after(), self._retry)

    def _retry(self) -> None:
        self._retry_pending = False
        self.pump()

    def _to_events(self, items: list) -> list[list]:
        token = self.next_token
        index = self.spec.index
        events = []
        entries = []
        for msg_id, data, metadata, handle in items:
            events.append([index, token, msg_id, data, metadata, "default", "default",
                           metadata.get("error")])
            entries.append((token, handle))
            token += 1
        self.next_token = token
        self.inflight.add_many(entries)
        return events

    def _dispatch(self, events: list[list]) -> list[list]:
        leftovers, sent = self.downstream.deliver(events, _encode_events)
        self.counters["out"] += sent
        return leftovers

    # -- drain, requeue and idleness ------------------------------------------------------------
    def _maybe_cancel_consumers(self) -> None:
        if self.draining and not self.buffer and not self.downstream.closed:
            self.downstream.cancel_all("shutdown")
            self.report("drained", {})

    def _watch_idle(self) -> None:
        idle = not self.buffer and not len(self.inflight) and self.source.exhausted()
        if idle != self._idle:
            self._idle = idle
            self.report("idle", {"idle": idle})
        if self.draining and not len(self.inflight) and not self._settled_reported:
            self._settled_reported = True
            self.report("settled", self.stats())
        self.call_later(0.1 if self.draining else 0.2, self._watch_idle)

    def cmd_shutdown(self) -> None:
        """Terminator, step 2: stop fetching, flush what was fetched, then cancel."""
        self.draining = True
        self._pause_source()
        self.pump()

    def cmd_pause(self) -> None:
        self.paused = True
        self._pause_source()

    def cmd_resume(self) -> None:
        self.paused = False
        resume = getattr(self.source, "resume", None)
        if resume is not None:
            resume()
        self.pump()

    def _pause_source(self) -> None:
        pause = getattr(self.source, "pause", None)
        if pause is not None:
            pause()

    def cmd_requeue(self, reason: str = "") -> None:
        """A stage downstream died: whatever it held is lost, so hand it all back."""
        handles = self.inflight.take_all()
        if handles:
            self.source.requeue(handles)
            self.counters["requeued"] += len(handles)
            log.info("%s: requeued %d in-flight messages (%s)", self.id, len(handles), reason)
        self.pump()

    def cmd_close(self) -> None:
        """Terminator, last step: the batch processors are done; close the source."""
        self.running = False


def _encode_events(evs: list[list]) -> bytes:
    try:
        return protocol.events(evs)
    except Exception:
        # a value msgpack cannot carry: fail that message instead of the frame
        for ev in evs:
            if not protocol.packable(ev):
                ev[3], ev[4] = repr(ev[3]), {k: repr(v) for k, v in dict(ev[4]).items()}
                ev[7] = "message data or metadata cannot be encoded with msgpack"
        return protocol.events(evs)


def _stable_hash(key: Any) -> int:
    """A hash that is the same in every process (``hash(str)`` is salted per process)."""
    if isinstance(key, int):
        return key
    return zlib.crc32(repr(key).encode())
