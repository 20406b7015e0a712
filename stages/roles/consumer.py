"""The consumer half shared by processors, batchers and batch processors.

Two ways to ask for events, chosen per stage:

* **Per upstream** (GenStage's automatic demand; batchers and batch processors, and
  processors whose producers run the plain ``demand`` dispatcher): subscribe, ask
  ``max_demand`` from each upstream, and after handling ``max_demand - min_demand`` events
  from it ask for that many again.
* **One budget** (``budget=True``, processors): ``max_demand`` units shared by all the
  producers, placed and moved by :class:`.demand.DemandBudget`; this module only turns its
  actions into ASK / RETRACT frames and tells it what happened.  A producer's SUBSCRIBED
  answer says which dispatcher it runs; under ``demand`` the subscription falls back to
  per upstream, so ``dispatcher = "demand"`` stays plain GenStage end to end, the baseline
  the benchmarks compare against.

A stage may stop asking (``can_ask``: back-pressure) when its own output is backed up: that is how
back-pressure reaches the source.  An upstream that cancels with "shutdown" is done; when
every upstream is done the stage finishes (:mod:`.consumer_stage`).  An upstream that
restarted is subscribed to afresh when the daemon says so (one path: its answer
"unknown subscription" to an ask only voids what was out there).

A consumer that leaves a running pipeline (a resize) cancels its subscriptions
(:meth:`Subscriptions.leave`); each upstream answers with a cancel of its own after the
events it already sent (the same ordering that makes SUBSCRIBED and RETRACTED fences), so
once every upstream is done nothing more is on its way to us.

With long jobs the budget keeps only what it can start soon: :meth:`Subscriptions.shed`
gives the rest of a processor's inbox back to the producers (RETURN).

Idleness, which the budget needs, is observed here: no events for :data:`IDLE_AFTER`
seconds after the last ones were handled.  The delay is hysteresis: under load the next
frame comes within a round trip, so demand is not re-spread between frames.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from ..flow.demand import ASK, Action, DemandBudget
from ..flow.window import PacedWindow
from ..wire import events as ev
from ..wire import protocol

#: seconds without events after which a budgeted consumer counts as idle
IDLE_AFTER = 0.02
#: seconds between moves of an idle consumer's cover when producers outnumber its units
ROTATE_EVERY = 0.25
#: how long a consumer of long jobs waking from idle waits for more frames before it
#: starts: its idle spread may have drawn jobs from several producers at once, and the
#: ones still on the wire are given back only if they are here before the job starts
GATHER_FOR = 0.003

PENDING, CLASSIC, BUDGET = "pending", "classic", "budget"
#: Why an upstream is taken as done without its cancel (the consumer's own reasons, next to
#: :mod:`.protocol`'s CANCEL_* that cross the wire): it restarted while this consumer was
#: leaving, or during the drain, so what its previous incarnation sent went back with it.
RESTARTED_WHILE_LEAVING = "restarted while we left"
RESTARTED_IN_DRAIN = "restarted during the drain"


class Upstream:
    __slots__ = ("consumed", "done", "handled", "index", "mode", "owed", "partition", "ref",
                 "sock", "stage_id", "window")

    def __init__(self, stage_id: str, sock: zmq.Socket, partition, index: int) -> None:
        self.stage_id = stage_id
        self.sock = sock
        self.index = index
        self.consumed = 0      # per-upstream mode: events handled since the last ask
        self.done = False
        self.partition = partition
        self.mode = CLASSIC    # budgeted consumers: PENDING until SUBSCRIBED says
        self.ref = 0           # of our latest SUBSCRIBE: only its SUBSCRIBED counts
        #: events from it handled, over this process's life: the edge's rate on the page
        self.handled = 0
        #: per-upstream mode: asked of it and not yet handled (the edge's demand)
        self.owed = 0
        #: a paced consumer's window on it (:class:`.window.PacedWindow`), else None
        self.window: PacedWindow | None = None


class Subscriptions:
    """The upstream side of one consumer stage."""

    def __init__(self, max_demand: int, min_demand: int,
                 can_ask: Callable[[], bool] = lambda: True, *, budget: bool = False,
                 index: int = 0,
                 call_later: Callable[[float, Callable[[], None]], None] | None = None,
                 counters: dict[str, int] | None = None, paced: bool = False) -> None:
        self.max_demand = max_demand
        #: per upstream, a window that follows the pace of the work instead of a fixed
        #: ``max_demand`` (batch processors: :class:`.window.PacedWindow`)
        self.paced = paced
        self.ask_every = max(1, max_demand - min_demand)
        self.can_ask = can_ask
        self.upstreams: list[Upstream] = []
        self.by_sock: dict[zmq.Socket, Upstream] = {}
        self.resubscribe = True
        #: cancelled our subscriptions to leave the pipeline (:meth:`leave`)
        self.leaving = False
        self.budget: DemandBudget | None = None
        if budget:
            if call_later is None:
                raise ValueError("a budgeted consumer needs call_later to notice idleness")
            self.budget = DemandBudget(max_demand, max_demand - self.ask_every, index=index,
                                       timed=True)
        self.call_later = call_later
        self._activity = 0             # frames received or handled, for the idle check
        self._armed_at = 0
        self._idle_check_armed = False
        self._rotating = False
        self.counters = {"asks": 0, "retracts": 0, "event_frames": 0, "returned": 0}
        #: where frames sent are counted (``frames``): the stage's counters, if given
        self.sent = counters if counters is not None else {}
        self.sent.setdefault("frames", 0)

    # -- subscribing ----------------------------------------------------------------------
    def add(self, stage_id: str, sock: zmq.Socket, partition=None) -> Upstream:
        index = self.budget.add() if self.budget is not None else len(self.upstreams)
        up = Upstream(stage_id, sock, partition, index)
        if self.paced:
            up.window = PacedWindow(self.max_demand, self.max_demand - self.ask_every)
        self.upstreams.append(up)
        self.by_sock[sock] = up
        self.subscribe(up)
        return up

    def subscribe(self, up: Upstream) -> None:
        up.consumed = 0
        up.owed = 0            # what the earlier subscription was owed is void
        up.done = False
        min_demand = self.max_demand - self.ask_every
        up.ref += 1
        up.sock.send(protocol.subscribe(self.max_demand, min_demand, up.partition, up.ref),
                     zmq.NOBLOCK)
        if self.budget is None:
            if up.window is not None:
                n = up.window.subscribed()
                if n:
                    self._send_ask(up, n)
                return
            self._send_ask(up, self.max_demand)
            return
        # ask nothing before SUBSCRIBED: it fences off whatever an earlier subscription
        # left in flight, and says whether the producer runs plain GenStage
        up.mode = PENDING
        self._apply(self.budget.unsubscribed(up.index))

    def resubscribe_to(self, stage_id: str) -> None:
        """``stage_id`` restarted (the daemon says so): subscribe to it afresh.  Leaving, or
        in the drain (no resubscribe), it is done instead: the new incarnation knows no
        subscription of ours to answer, and what the old one sent went back to the source
        with it."""
        up = self.find(stage_id)
        if up is None:
            return
        if self.leaving:
            self.cancelled(up, RESTARTED_WHILE_LEAVING)
        elif self.resubscribe:
            self.subscribe(up)
        else:
            # the drain: Broadway's terminator told us not to resubscribe, so an upstream
            # that went away is done (its successor is told to shut down; what the old one
            # sent went back to the source with it)
            self.cancelled(up, RESTARTED_IN_DRAIN)

    def on_frame(self, up: Upstream, msg: list) -> None:
        """SUBSCRIBED, RETRACTED and CANCEL from an upstream (events go through
        :meth:`received` and :meth:`consumed`)."""
        kind = msg[protocol.KIND_AT]
        if kind == protocol.CANCEL:
            self.cancelled(up, msg[protocol.VALUE])
        elif self.budget is None or (up.mode == CLASSIC and kind != protocol.SUBSCRIBED):
            return
        elif kind == protocol.SUBSCRIBED:
            if msg[protocol.SUBSCRIBED_REF] != up.ref:
                return                 # answers an earlier SUBSCRIBE; ours is on its way
            up.consumed = 0
            if msg[protocol.SUBSCRIBED_POLICY] == "demand":
                up.mode = CLASSIC
                self._send_ask(up, self.max_demand)
            else:
                up.mode = BUDGET
                self.budget.report_busy = msg[protocol.SUBSCRIBED_POLICY] == "spread"
                self._sync_backpressure()
                self._apply(self.budget.subscribed(up.index))
        elif kind == protocol.RETRACTED:
            self._sync_backpressure()
            self._apply(self.budget.retracted(up.index, msg[protocol.VALUE]))

    # -- events ---------------------------------------------------------------------------
    def received(self, up: Upstream, n: int) -> bool:
        """``n`` events from ``up`` arrived; call before handling them, so a consumer that
        was idle reports itself busy before it starts.  True when the budget counts them:
        pass that to :meth:`consumed` (a resubscription in between changes the mode)."""
        self.counters["event_frames"] += 1
        if self.budget is None or up.mode == CLASSIC:
            if up.window is not None:
                up.window.received(n)
            return False
        self._apply(self.budget.received(up.index, n))
        if not self._idle_check_armed:
            self._active()
        return True

    def consumed(self, up: Upstream, n: int, seconds: float | None = None,
                 budgeted: bool | None = None) -> None:
        """``n`` events from ``up`` were handled (in ``seconds``: the budget's pace);
        ``budgeted`` as :meth:`received` said."""
        up.handled += n
        if budgeted is None:
            budgeted = self.budget is not None and up.mode != CLASSIC
        if budgeted and self.budget is not None:
            self._sync_backpressure()
            self._apply(self.budget.finished(n, seconds))
            self._active()
            return
        up.owed = max(0, up.owed - n)
        if up.window is not None:
            up.window.finished(n)
            self._ask_window(up)
            return
        up.consumed += n
        if up.consumed >= self.ask_every and self.can_ask():
            self._send_ask(up, up.consumed)
            up.consumed = 0

    def timed(self, up: Upstream, n: int, seconds: float) -> None:
        """A paced consumer's work on ``n`` events from ``up`` took ``seconds`` (the pace
        its window follows; the events are finished later, by :meth:`consumed`): what the
        window has room for is asked at once."""
        if up.window is not None:
            up.window.timed(n, seconds)
            # asked now, not when they are finished: with Spark a batch is finished at
            # its commit, and batches waiting for it count against max_demand only
            self._ask_window(up)

    def _ask_window(self, up: Upstream) -> None:
        if up.done or self.leaving or not self.can_ask():
            return
        n = up.window.asks()
        if n:
            self._send_ask(up, n)

    def release(self) -> None:
        """The stage's output is back under its bound: send the asks that back-pressure
        held back."""
        for up in self.upstreams:
            if up.window is not None:
                self._ask_window(up)
                continue
            if up.mode == CLASSIC and up.consumed >= self.ask_every and not up.done:
                self._send_ask(up, up.consumed)
                up.consumed = 0
        if self.budget is not None and self.budget.backpressured:
            self._apply(self.budget.set_backpressure(False))

    def cancelled(self, up: Upstream, reason: str) -> None:
        if up.done:
            return
        if reason == protocol.CANCEL_UNKNOWN and not self.leaving:
            # the upstream restarted and knows us no more: what was out there is void, and
            # the daemon's resubscribe (sent once the new incarnation is up) is the one
            # path that subscribes again (:meth:`resubscribe_to`)
            if self.budget is not None and up.mode != CLASSIC:
                self._apply(self.budget.unsubscribed(up.index))
        else:
            up.done = True
            if self.budget is not None:
                self._sync_backpressure()
                self._apply(self.budget.done(up.index))

    def leave(self) -> None:
        """Leave the pipeline (a resize removes this stage): ask nothing more, resubscribe
        to nothing, and cancel every subscription.  Each upstream answers after the events
        it already sent (:class:`.downstream.Downstream` echoes a cancel), and that answer
        makes it done; an upstream that restarted meanwhile knows no subscription of ours
        ("unknown subscription", or :meth:`resubscribe_to`) and is done too: what its previous
        incarnation sent went back to the source with its crash."""
        self.leaving = True
        self.resubscribe = False
        if self.budget is not None:
            self.budget.backpressured = True
        for up in self.upstreams:
            if not up.done:
                up.sock.send(protocol.cancel(protocol.CANCEL_LEAVING), zmq.NOBLOCK)
                self.sent["frames"] += 1

    def remove(self, up: Upstream) -> None:
        """Forget an upstream that left the pipeline (its cancel said so); the caller
        closes its socket.  Per-upstream (classic) consumers only: a budget's indexes
        are positions in :attr:`upstreams`."""
        if self.budget is not None:
            raise ValueError("a budgeted consumer's upstreams cannot be removed")
        self.upstreams.remove(up)
        del self.by_sock[up.sock]

    def sheds(self) -> bool:
        """Whether received events are worth looking ahead at before starting the next:
        only when the budget would keep fewer than ``max_demand`` (long jobs)."""
        b = self.budget
        return b is not None and b.report_busy and b.prefetch() < b.max_demand

    def gather_for(self) -> float:
        """Seconds to wait for frames still on the wire before starting (once per wake
        from idle, long jobs only; see :data:`GATHER_FOR`)."""
        b = self.budget
        if b is None or not b.woke:
            return 0.0
        b.woke = False
        return GATHER_FOR

    def shed(self, inbox: deque[tuple[Upstream, list, bool, Any]]) -> None:
        """Keep the oldest events the budget allows in ``inbox`` (frames received, not
        started: upstream, events, budgeted, the frame's header) and RETURN the rest to
        their producers, so long jobs that arrived together go to whichever consumer
        frees up first (a producer knows the status of its own events)."""
        budget = self.budget
        if budget is None:
            return
        # an upstream that is done (its stream ended) takes nothing back: those events stay
        waiting = sum(len(evs) for up, evs, budgeted, _ in inbox if budgeted and not up.done)
        keep = budget.keep(waiting)
        if keep >= waiting:
            return
        kept: deque[tuple[Upstream, list, bool, Any]] = deque()
        #: per upstream (in the order first met), the blocks it takes back and their codecs
        back: dict[Upstream, list] = {}
        codecs: dict[Upstream, set[int]] = {}
        for up, evs, budgeted, header in inbox:
            if not budgeted or up.done:
                kept.append((up, evs, budgeted, header))
                continue
            take = min(keep, len(evs))
            keep -= take
            if take:
                kept.append((up, evs[:take] if take < len(evs) else evs, True, header))
            if take < len(evs):
                back.setdefault(up, []).append(evs[take:])
                codecs.setdefault(up, set()).add(evs.codec)
        inbox.clear()
        inbox.extend(kept)
        for up, blocks in back.items():
            # one codec per frame: blocks of a producer whose data came in two kinds (a
            # source that gave bytes, then values) go back as values
            codec = blocks[0].codec if len(codecs[up]) == 1 else ev.MSGPACK
            evs = [row for b in blocks for row in (b if b.codec == codec
                                                   else ev.transcode(b.rows(), b.codec))]
            for frame, _ in protocol.frames_within_limit(
                    evs, lambda rows, codec=codec: protocol.give_back(rows, codec)):
                up.sock.send(frame, zmq.NOBLOCK)
                self.sent["frames"] += 1
            self.counters["returned"] += len(evs)
            self._sync_backpressure()
            self._apply(budget.returned(len(evs)))

    # -- idleness -------------------------------------------------------------------------
    def _active(self) -> None:
        """Events arrived or were handled: idle is IDLE_AFTER seconds after the last of
        either (after a long job, its re-ask gets the time to be answered)."""
        self._activity += 1
        if not self._idle_check_armed:
            self._idle_check_armed = True
            self._armed_at = self._activity
            self.call_later(IDLE_AFTER, self._check_idle)

    def _check_idle(self) -> None:
        self._idle_check_armed = False
        budget = self.budget
        if budget is None or budget.is_idle:
            return
        if self._activity != self._armed_at or budget.held:
            self._idle_check_armed = True
            self._armed_at = self._activity
            self.call_later(IDLE_AFTER, self._check_idle)
            return
        self._sync_backpressure()
        self._apply(budget.idle())
        if budget.needs_rotation and not self._rotating:
            self._rotating = True
            self.call_later(ROTATE_EVERY, self._rotate)

    def _rotate(self) -> None:
        budget = self.budget
        if budget is None or not budget.is_idle or not budget.needs_rotation:
            self._rotating = False
            return
        self._sync_backpressure()
        self._apply(budget.rotate())
        self.call_later(ROTATE_EVERY, self._rotate)

    # -- frames ---------------------------------------------------------------------------
    def _sync_backpressure(self) -> None:
        """Back-pressure is the stage's to judge; the budget asks nothing while it is on."""
        if self.budget is not None:
            self.budget.backpressured = self.leaving or not self.can_ask()

    def _apply(self, actions: list[Action]) -> None:
        for kind, i, n in actions:
            up = self.upstreams[i]
            if kind == ASK:
                self._send_ask(up, n)
            else:
                self.counters["retracts"] += 1
                self.sent["frames"] += 1
                up.sock.send(protocol.retract(n), zmq.NOBLOCK)

    def _send_ask(self, up: Upstream, n: int) -> None:
        if self.leaving:
            return      # cancelled: an ask would only be answered "unknown subscription"
        self.counters["asks"] += 1
        self.sent["frames"] += 1
        up.owed += n
        up.sock.send(protocol.ask(n), zmq.NOBLOCK)

    # -- views ----------------------------------------------------------------------------
    def find(self, stage_id: str) -> Upstream | None:
        for up in self.upstreams:
            if up.stage_id == stage_id:
                return up
        return None

    def stats(self) -> dict[str, Any]:
        s: dict[str, Any] = dict(self.counters)
        if self.budget is not None:
            s.update(demand_out=sum(self.budget.out(up.index) for up in self.upstreams),
                     strays=self.budget.strays, idles=self.budget.idles)
        s["edges"] = self.edges()
        return s

    def edges(self) -> dict[str, list[int]]:
        """Per upstream, ``[events handled from it, demand outstanding on it]``: the
        subscription's figures GenStage would show, read by the live page each second."""
        budget = self.budget
        return {up.stage_id: [up.handled, budget.out(up.index)
                              if budget is not None and up.mode != CLASSIC else up.owed]
                for up in self.upstreams}

    @property
    def all_done(self) -> bool:
        return all(up.done for up in self.upstreams)
