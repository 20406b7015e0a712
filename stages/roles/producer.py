"""The producer stage: wraps a source, dispatches on demand, keeps the in-flight table.

Every message it emits gets a token and an in-flight entry (token → the source's handle)
until an ACK names it.  Acks come straight from whichever stage finished the message.
When the daemon reports that a stage downstream died, everything still in flight is handed
back to the source (``requeue``): at-least-once, so a SIGKILL anywhere loses nothing.

Poison messages: when a processor died unexpectedly, the daemon names with the requeue
what that processor was running; :mod:`.poison.guard` decides what follows (a message that
reached ``max_crashes`` is emitted already failed, a suspect is sent alone in its frame),
this module only sends.

Tokens start at the incarnation's start time in nanoseconds, so an ack for a message of a
previous incarnation can never name a message of this one.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from itertools import repeat
from operator import contains, itemgetter
from typing import Any

from ..flow.dispatch import (
    Dispatcher,
    GenStageDemandDispatcher,
    PartitionDispatcher,
    SpreadDispatcher,
    stable_hash,
)
from ..flow.inflight import InFlightTable
from ..flow.ratelimit import SharedRateLimit
from ..poison import books
from ..poison.guard import PoisonGuard
from ..runtime.handler import load_handler
from ..runtime.spec import StageSpec
from ..runtime.stage import Stage, ZmqIO
from ..runtime.tally import NoteRing, notes_path
from ..sources import get_source
from ..sources.base import FailedItem, failure_of
from ..wire import commands, protocol
from ..wire import events as ev
from .downstream import Downstream

log = logging.getLogger("offbroadway.producer")

#: the reports that carry a stage's figures, and with them its source's notes
_FIGURES = (commands.Stats, commands.Settled, commands.Left, commands.Done)
#: notes kept for a report at most (a hub that refuses reports for long loses the oldest)
_NOTES_KEPT = 1 << 20

#: a push source's deliveries (RabbitMQ, NATS) arrive a few dozen per wake-up at full
#: speed: a fetch short of this many, and of the demand, waits up to ``COALESCE_WAIT``
#: seconds for more before it is sent, so that frames carry hundreds of events, not tens
#: (every frame costs each stage it crosses tens of microseconds)
COALESCE, COALESCE_WAIT = 256, 0.005

#: a fetched item's parts (``(id, data, metadata, handle)``: :mod:`.sources.base`), read
#: at C speed for a whole fetch (whether any metadata notes an ``error``, the handles)
_METADATA, _HANDLE = itemgetter(2), itemgetter(3)


class ProducerStage(Stage):
    def __init__(self, spec: StageSpec, io: ZmqIO | None = None) -> None:
        super().__init__(spec, io)
        source_cls = get_source(spec.source)
        self.source = source_cls(spec.source_options, pipeline=spec.pipeline,
                                 producer_index=spec.index, producer_count=spec.producer_count,
                                 state_dir=spec.state_dir)
        if spec.partition_by:
            handler = load_handler(spec.handler)
            route = getattr(handler, spec.partition_by)
            n = spec.consumer_count

            def key(event: tuple) -> int:
                status = self._failed.get(protocol.event_token(event))
                msg = protocol.event_to_message(event, status, self.codec)
                return stable_hash(route(msg)) % n

            self.dispatcher: Dispatcher = PartitionDispatcher(range(n), key)
        elif spec.dispatcher == "demand":
            self.dispatcher = GenStageDemandDispatcher()
        else:
            self.dispatcher = SpreadDispatcher(offset=spec.index)
        self.inflight: InFlightTable = InFlightTable()
        self.rate: SharedRateLimit | None = None
        #: event rows fetched and not yet sent, their data all in :attr:`codec`
        self.buffer: list[tuple] = []
        self.codec = ev.MSGPACK
        #: token -> why, for emitted events that are already failed (a source's bad line, a
        #: poison verdict, data msgpack cannot carry): a frame says the status of all its
        #: events, so these go in frames of their own; empty in the common case
        self._failed: dict[int, str] = {}
        self._acks: list = []
        self._fails: list = []
        self.next_token = self.first_token = time.time_ns()
        #: crashes blamed per message, suspects and their quarantine (:mod:`.poison.guard`)
        self.poison = PoisonGuard(spec.max_crashes, stage_id=spec.id)
        #: where the guard's books outlive this process (:mod:`.poison.books`), and the
        #: guard's revision last written there
        self._books_path = books.path(spec.runtime_dir, spec.id)
        self._books_revision = 0
        #: told ``Shutdown``: the stop's drain (it ends with this stage's cancels)
        self.draining = False
        #: the operator's pause (``offbroadway drain``): fetches nothing until ``Resume``
        self.paused = False
        self._retry_pending = False
        #: when the buffered rows of a short push fetch go out at the latest (None: now)
        self._hold_until: float | None = None
        self._idle: bool | None = None
        self._settled_reported = False
        self.counters.update(requeued=0, unknown_acks=0, returned=0, stale_returns=0,
                             poison_strikes=0, poison_failed=0)
        self.accept(commands.Shutdown, self._on_shutdown)
        self.accept(commands.Pause, self._on_pause)
        self.accept(commands.Resume, self._on_resume)
        self.accept(commands.Requeue, self._on_requeue)
        self.accept(commands.ReleaseSuspects, self._on_release_suspects)
        self.accept(commands.Window, self._on_window)
        self.accept(commands.Reconcile, self._on_reconcile)
        #: the source's failure-book notes not yet sent to the daemon (see :meth:`report`)
        self._notes: list[list] = []
        #: the source counts failed messages itself (``failed`` is its ``rejected``, read
        #: at each report), not one per failed settlement (set by :meth:`stats`)
        self._own_books = False
        #: the source counts its acks as they leave for the broker (``acks_sent``)
        self._acks_at_source = False
        self._acked_slot = self.tally.acked_slot()    # (the real one from :meth:`setup`)

    # -- lifecycle ------------------------------------------------------------------------------
    def setup(self) -> None:
        #: the pipeline's shared rate limit (:mod:`.ratelimit`), when the daemon made one
        self.rate = SharedRateLimit.attach(self.spec.runtime_dir)
        # before the first fetch: a message our predecessor saw crash keeps its count
        if self.spec.max_crashes:
            kept = self.poison.restore(books.load(self._books_path))
            if kept:
                log.info("%s: %d suspect message(s) kept from this producer's previous "
                         "incarnation (crashes counted on)", self.id, kept)
            self._books_revision = self.poison.revision
        # the count of acks, kept where a SIGKILL cannot take it (:mod:`.tally`): by the
        # source as its acks leave, on its own thread, or here as they are applied
        count_acks = getattr(self.source, "count_acks", None)
        if count_acks is not None:
            count_acks(self.tally.sent_acks())
            self._acks_at_source = True
        else:
            self._acked_slot = self.tally.acked_slot()
        journal = getattr(self.source, "journal_notes", None)
        if journal is not None:
            # its failure-book notes outlive a SIGKILL (:class:`.tally.NoteRing`)
            try:
                journal(NoteRing(notes_path(self.spec.runtime_dir, self.id), os.getpid()))
            except OSError as exc:
                log.warning("%s: no notes file (%s): a SIGKILL loses the failure-book "
                            "notes since the last report", self.id, exc)
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
        # the guard counts its own (metrics and reports both read the counters after this)
        self.counters.update(poison_strikes=self.poison.struck,
                             poison_failed=self.poison.failed)
        src = self.source.stats()
        self._own_books = "failures" in src
        if self._acks_at_source:
            self.counters["acked"] = int(src.get("acks_sent") or 0)
        if self._own_books:
            # the source counts failed messages itself, each once however often it was
            # delivered: the books' ``failed`` are the ones it rejected (a counter never goes
            # down: those back in the queue are the gauge ``failing``), ``failures`` the
            # failed deliveries
            self.counters["failed"] = int(src.get("rejected") or 0)
        s = super().stats()
        if "failing" in src:
            s["failing"] = int(src.get("failing") or 0)
        # a source without a connection (spool, generator) has no state and is always there
        connected = src.get("state", "connected") == "connected"
        s.update(inflight=len(self.inflight), buffered=len(self.buffer),
                 demand=self.dispatcher.demand, draining=self.draining, paused=self.paused,
                 suspects=len(self.poison), source=src,
                 source_connected=int(connected))
        return s

    def report(self, report: commands.Report) -> None:
        """A report with the stage's figures carries the source's failure-book notes
        since the last one (``stats["notes"]``: daemon/core/failing.py), from which the
        daemon reconciles the producers' books.  Notes a report could not take (the hub
        refused it) go with the next one.  A source whose failure books are its own alone
        (or that keeps none) has no ``take_notes``."""
        take_notes = getattr(self.source, "take_notes", None)
        if take_notes is not None and isinstance(report, _FIGURES):
            self._notes.extend(take_notes())
            if self._notes:
                notes = self._notes
                if len(notes) > _NOTES_KEPT:
                    del notes[:-_NOTES_KEPT]
                report = dataclasses.replace(report, stats={**report.stats, "notes": notes})
                super().report(report)
                self._notes = []
                return
        super().report(report)

    def _on_reconcile(self, command: commands.Reconcile) -> None:
        reconcile = getattr(self.source, "reconcile", None)
        if reconcile is not None:
            reconcile(command.settled, command.moved)

    # -- frames from consumers ------------------------------------------------------------------
    def _on_frame(self, peer: bytes, msg: list) -> None:
        if msg[protocol.KIND_AT] == protocol.ACK:
            # settled once per burst of frames: the source's durable write (an fsync for
            # the spool) is per call, so one call for many frames
            self._acks.extend(protocol.acked_tokens(msg[protocol.ACK_OK]))
            self._fails.extend(msg[protocol.ACK_FAILED])

    def _on_burst(self) -> None:
        if self._acks or self._fails:
            self._settle(self._acks, self._fails)
            self._acks, self._fails = [], []
            if self.draining:
                self._report_settled()    # the drain's last ack: say so now, not at a tick
        self.pump()

    def _on_return(self, peer: bytes, events: ev.Block) -> None:
        """A consumer gives back events it will not start soon: first in line again (the
        burst's pump dispatches them).  Only our own events still in flight and not
        already waiting here are taken: anything else is a stale or broken frame."""
        index, inflight = self.spec.index, self.inflight
        token_of, origin_of = protocol.event_token, protocol.event_origin
        waiting = set(map(token_of, self.buffer))
        back = []
        for row in events:
            token = token_of(row)
            try:
                ours = origin_of(row) == index and token in inflight and token not in waiting
            except TypeError:           # an unhashable token off the wire
                ours = False
            if ours:
                waiting.add(token)
                back.append(row)
        # stale: given back after a requeue already handed them to the source again
        self.counters["returned"] += len(back)
        # ``out`` counts events that left and stayed out: these will be sent (and counted)
        # again, so an operator never reads more out than in
        self.counters["out"] -= len(back)
        self.counters["stale_returns"] += len(events) - len(back)
        if back:
            self._buffer(back, events.codec, front=True)

    def _settle(self, ok: list, failed: list) -> None:
        self.poison.on_settled(ok, failed, self.inflight.__contains__)
        self._keep_books()
        if self._failed:
            self._forget_failed(ok, failed)
        handles, failures = self.inflight.settle(ok, failed)
        self.counters["unknown_acks"] = self.inflight.unknown
        if handles:
            self.source.ack(handles)
            if not self._acks_at_source:
                # applied at the source: a SIGKILL from here on must not take them from
                # the books (the next report may never come)
                self._acked_slot[0] = self.counters["acked"] = \
                    self.counters["acked"] + len(handles)
        if failures:
            self.source.fail(failures)
            self.counters["failures"] = self.counters.get("failures", 0) + len(failures)
            if not self._own_books:
                self.counters["failed"] += len(failures)
            self.tally.write(self.counters)

    # -- moving events --------------------------------------------------------------------------
    def pump(self) -> None:
        """Dispatch what is buffered, then fetch as much as there is demand for."""
        why = self.source.taken_back()
        if why is not None:
            # said before anything the source delivers again is sent on (docs/design-spark.md)
            self.report(commands.TakenBack(why))
        if self.buffer and not self._holding():
            self._hold_until = None
            self.buffer = self._dispatch(self.buffer)
        if self.draining or self.paused:
            self._maybe_cancel_consumers()
            return
        want = self.dispatcher.demand - len(self.buffer)
        if want > 0 and self.rate is not None:
            asked, want = want, self.rate.take(want)
            if want < asked:      # the pipeline's budget is spent until the next window
                self._retry_at(self.rate.next_window_in())
        if want <= 0:
            if self.source.fileno() is not None:
                self.source.fetch(0)   # clears a push source's wake-up: no level-triggered spin
            return
        items = self.source.fetch(want)
        if self.rate is not None and len(items) < want:
            self.rate.give_back(want - len(items))
        if items:
            self.counters["in"] += len(items)
            self._buffer(*self._to_events(items))
            if not self._hold(self.dispatcher.demand):
                self._hold_until = None
                self.buffer = self._dispatch(self.buffer)
        if len(items) < want and self.source.fileno() is None and not self._retry_pending:
            self._retry_pending = True
            self.call_later(self.source.retry_after(), self._retry)

    def _hold(self, demand: int) -> bool:
        """Whether the buffered rows of a push source wait a moment for more (see
        :data:`COALESCE`): fewer than that and than the ``demand`` they were fetched
        for, and no stop under way."""
        if (self.source.fileno() is None or self.draining
                or len(self.buffer) >= min(COALESCE, demand)):
            return False
        if self._hold_until is None:
            self._hold_until = time.monotonic() + COALESCE_WAIT
            self.call_later(COALESCE_WAIT, self._release)
        return self._holding()

    def _holding(self) -> bool:
        return (self._hold_until is not None and not self.draining
                and len(self.buffer) < COALESCE and time.monotonic() < self._hold_until)

    def _release(self) -> None:
        self._hold_until = None
        self.pump()

    def _retry_at(self, delay: float) -> None:
        if not self._retry_pending:
            self._retry_pending = True
            self.call_later(delay, self._retry)

    def _retry(self) -> None:
        self._retry_pending = False
        self.pump()

    def _to_events(self, items: list) -> tuple[list[tuple], int]:
        """Rows for fetched items (their data and metadata encoded here, once for the whole
        trip) and the codec of their data."""
        first = token = self.next_token
        index = self.spec.index
        codec, ids, datas, metas, unencodable = ev.encode_items(items)
        events = ev.new_rows(index, first, ids, datas, metas)
        token = first + len(items)
        self.next_token = token
        self.inflight.add_range(first, map(_HANDLE, items))
        if (any(map(isinstance, items, repeat(FailedItem)))
                or any(map(contains, map(_METADATA, items), repeat("error")))):
            # a source's bad lines (rare); metadata["error"]: a source written before
            # FailedItem, still taken
            failed = self._failed
            for i, item in enumerate(items):
                reason = failure_of(item)
                if reason is not None:
                    failed[first + i] = reason
        for i, why in unencodable.items():
            # a value the codec cannot carry: that message fails, here, and alone (logged
            # with the other failures of its reason by the processor that hands it on)
            self._failed[first + i] = f"{why}: it cannot be sent to the processors"
        self.poison.on_fetched(events, self._failed)
        return events, codec

    def _buffer(self, rows: list[tuple], codec: int, front: bool = False) -> None:
        """Rows into the buffer, which holds one codec: a fetch whose data differs in kind
        from what waits (a source that gave bytes, then values) is carried as values."""
        if not self.buffer:
            self.codec = codec
        elif codec != self.codec:
            self.buffer = ev.transcode(self.buffer, self.codec)
            rows = ev.transcode(rows, codec)
            self.codec = ev.MSGPACK
        self.buffer = rows + self.buffer if front else self.buffer + rows

    def _dispatch(self, events: list[tuple]) -> list[tuple]:
        # suspects to run go in frames of their own, so that if one kills its processor
        # again the blame names it alone (none while quarantined)
        events, alone, kept = self.poison.on_dispatch(events, self._failed)
        for row in alone:
            left, sent = self.downstream.deliver_frames([row], self._frames)
            self.counters["out"] += sent
            kept.extend(left)
        leftovers, sent = self.downstream.deliver_frames(events, self._frames)
        self.counters["out"] += sent
        return kept + leftovers if kept else leftovers

    def _frames(self, share: list[tuple]) -> list[tuple[bytes, list]]:
        """A consumer's share as EVENTS frames: one in the common case; with failed
        events among them, one per status (a frame says its events' status once)."""
        try:
            return self._frames_by_status(share)
        except Exception:
            pass
        # data and metadata were encoded at the fetch: only an id the codec cannot carry
        # (a source's own class) is left; that message fails with its id as text (logged
        # with the other failures of its reason, once, by the processor that hands it to
        # handle_failed)
        for i, row in enumerate(share):
            if not protocol.packable(row[ev.ID]):
                why = protocol.unpackable(row[ev.ID], "the id")
                share[i] = row = (row[ev.ORIGIN], row[ev.TOKEN], repr(row[ev.ID]),
                                  row[ev.DATA], row[ev.METADATA])
                self._failed[row[ev.TOKEN]] = f"{why}: it cannot be sent to the processors"
        return self._frames_by_status(share)

    def _frames_by_status(self, share: list[tuple]) -> list[tuple[bytes, list]]:
        failed = self._failed
        if failed:
            token_of = protocol.event_token
            runs: dict[str | None, list[tuple]] = {}
            for ev in share:
                runs.setdefault(failed.get(token_of(ev)), []).append(ev)
        else:
            runs = {None: share}
        out: list[tuple[bytes, list]] = []
        for status, evs in runs.items():
            out.extend(protocol.frames_within_limit(
                evs, lambda e, status=status: protocol.events(e, status, codec=self.codec)))
        return out

    # -- failed events ------------------------------------------------------------------------
    def _forget_failed(self, ok: list, failed: list) -> None:
        """Settled failed events need no status any more (bounded memory)."""
        statuses = self._failed
        for t in ok:
            try:
                statuses.pop(t, None)
            except TypeError:         # an unhashable token off the wire
                pass
        for f in failed:
            if isinstance(f, (list, tuple)) and f:
                try:
                    statuses.pop(f[protocol.FAILED_TOKEN], None)
                except TypeError:
                    pass

    def _ours(self, token: object) -> bool:
        """Issued by this incarnation (an earlier one's token names nothing of ours)."""
        return (isinstance(token, int) and not isinstance(token, bool)
                and self.first_token <= token < self.next_token)

    # -- drain, requeue and idleness ------------------------------------------------------------
    def _maybe_cancel_consumers(self) -> None:
        if self.draining and not self.buffer and not self.downstream.closed:
            self.downstream.cancel_all(protocol.CANCEL_SHUTDOWN)

    def _watch_idle(self) -> None:
        # in flight does not count: the drain that ``--until-idle`` starts on this report
        # finishes those (a batcher flushes its partial batch at once instead of waiting
        # for ``batch_timeout``) and the producers settle them before they close
        idle = not self.buffer and self.source.exhausted()
        if idle != self._idle:
            self._idle = idle
            # the counts first: ``--until-idle`` starts its drain on this report, and a
            # status read then must not show the last tick's (up to a second old, before
            # the first fetch on a fast run: nothing in flight in a drain that has work)
            self.report(commands.Stats(self.stats()))
            self.report(commands.Idle(idle))
        if self.draining:
            self._report_settled()
        self.call_later(0.1 if self.draining else 0.2, self._watch_idle)

    def _report_settled(self) -> None:
        """Draining and nothing in flight: the daemon may stop the tree (reported once)."""
        if not len(self.inflight) and not self._settled_reported:
            self._settled_reported = True
            self.report(commands.Settled(self.stats()))

    def _on_shutdown(self, _: commands.Shutdown) -> None:
        """The drain: stop fetching, flush what was fetched, then cancel the consumers."""
        self.draining = True
        self._pause_source()
        self.pump()

    def _on_pause(self, _: commands.Pause) -> None:
        self.paused = True
        self._pause_source()

    def _on_resume(self, _: commands.Resume) -> None:
        self.paused = False
        resume = getattr(self.source, "resume", None)
        if resume is not None:
            resume()
        self.pump()

    def _on_window(self, command: commands.Window) -> None:
        """A resize changed the pipeline's shape: a source with a window sized for it
        (``prefetch = "auto"``) takes the new size; others have nothing to change."""
        set_window = getattr(self.source, "set_window", None)
        if set_window is not None:
            set_window(command.prefetch)

    def _pause_source(self) -> None:
        pause = getattr(self.source, "pause", None)
        if pause is not None:
            pause()

    def _on_requeue(self, command: commands.Requeue) -> None:
        """A stage downstream died: whatever it held is lost, so hand it all back.

        ``blame``: what the dead processor was running, if it died unexpectedly (see
        :mod:`.poison.guard`); ``quarantine``: keep suspects back until ``release_suspects``
        (the processors are restarting).
        """
        self.poison.on_requeue(command.blame, command.quarantine, self._ours)
        self._keep_books()
        self._failed.clear()       # every failed one is requeued: the source has them back
        # buffered events are in flight too: the source has them back, so sending them
        # now would run them twice (and a kept-back suspect, no longer watched, unisolated)
        self.buffer = []
        handles = self.inflight.take_all()
        if handles:
            self.source.requeue(handles)
            self.counters["requeued"] += len(handles)
            log.info("%s: requeued %d in-flight messages (%s)", self.id, len(handles),
                     command.reason)
        # the answer the daemon waits for (:meth:`Terminator.requeue_sent`): an idle report
        # of ours on its way may predate this requeue; from here on, ours know of it.  Not
        # idle now (what went back is at the source), the next tick says what is true
        self._idle = False
        self.report(commands.Idle(False))
        self.pump()

    def _keep_books(self) -> None:
        """The guard's books changed (a crash, a suspect settled): write them for this
        producer's successor (:mod:`.poison.books`)."""
        if self.poison.revision != self._books_revision:
            self._books_revision = self.poison.revision
            books.save(self._books_path, self.poison.books())

    def _on_release_suspects(self, _: commands.ReleaseSuspects) -> None:
        """The processors are back after a crash: suspects may run again (one per frame)."""
        self.poison.on_release()
        self.pump()

