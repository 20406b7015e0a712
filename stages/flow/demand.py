"""A consumer's demand across all its producers: one budget of ``max_demand``, no hoarding.

GenStage gives every subscription its own ``max_demand``, so a processor subscribed to N
producers may be sent N x ``max_demand`` events, and demand parked at a producer with
nothing to send cannot serve a producer where events wait (seeds 003/004).  Here one
consumer owns one budget of ``max_demand`` units shared by all its producers.  A unit is
*out* at producer i from the ASK that places it until an event from i arrives (it is then
*held*: received, not yet handled) or a RETRACTED from i gives it back; handling returns it
to the pool (*free*).  ``held + sum(out) <= max_demand`` at all times, and the producer
never sends more than was asked, so the consumer never holds more than ``max_demand``
undelivered events summed over its producers.

Where the units go (the policy; any placement keeps the invariant):

* **Idle** (nothing received for a moment; the stage's loop says so by calling
  :meth:`DemandBudget.idle`): spread the budget evenly over the live producers, at least
  one unit at each while ``max_demand >= N``, the same shares for every consumer (the
  *targets*; with more producers than units each consumer covers ``max_demand`` of them
  from an offset set by its index, so siblings cover different producers, and the cover
  rotates while idle).  Surplus is retracted and deficits are asked for.  So a job
  arriving at any producer finds every idle consumer there with the same demand, and the
  producer's idle-first dispatch (``SpreadDispatcher``, ties broken from an offset set by
  the producer's index) starts K simultaneous jobs on K different consumers.
* **Busy** (the first events after idle): with ``report_busy`` (the ``spread`` policy) the
  consumer retracts its demand at every other producer at once, before it starts the job.
  That is how it reports its load: producers then see only the idle consumers, so the next
  job goes to one of them, not into the queue of a busy one.
* **Demand follows events**: while busy, freed units wait until there are at least
  ``max_demand - min_demand`` of them (GenStage's re-ask threshold, so frames stay big)
  and then go to a *hot* producer: one whose last delivery met all our demand there, so
  it probably has more.  How many: what is in hand and on order stays within the
  *prefetch*, about ``PREFETCH_SECONDS`` of work at the pace measured so far (so
  ``max_demand`` for short events, one at a time for long jobs, whose backlog is then
  shared by every consumer that frees up instead of queueing behind the first).  Demand
  beyond the prefetch is retracted, and events received beyond it are given back
  unstarted (RETURN, decided by :meth:`DemandBudget.keep`; spread policy only).  The
  consumer sticks to one hot producer for ``STICK_FOR x max_demand`` events (a producer
  kept busy answers fast; one woken per ask does not), then moves to the least recently
  asked hot one, so heavy load from every producer is served in turn.  With no hot
  producer the units go to the idle targets.  Demand parked where nothing arrived while
  ``max_demand`` events came from elsewhere is *stale* and retracted, and once busy for
  ``2 x max_demand`` events the consumer probes, one unit every ``2 x max_demand``
  events, the least recently asked producer that is neither hot nor asked, so a producer
  that filled up while everyone was busy elsewhere is found without anyone going idle.

Exactness.  RETRACT n is answered RETRACTED k with ``k <= min(n, the producer's unmet
demand)`` and ZeroMQ keeps order per connection, so every event the producer sent before
answering arrives before the answer: after it, ``out[i]`` minus ``k`` is exactly what the
producer still owes.  SUBSCRIBED is the same kind of fence for a new subscription (no
demand before it, exactly zero at it).  One RETRACT at a time per producer keeps the
bookkeeping to a flag.

Pure and synchronous: every method returns the frames to send as ``(ASK | RETRACT,
upstream, n)`` actions and the socket glue (:mod:`.consumer`) sends them, so every rule is
property-tested without a process (``tests/stages/test_demand.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

ASK = "ask"
RETRACT = "retract"
#: ``(ASK | RETRACT, upstream index, n)``: a frame the consumer must send.
Action = tuple[str, int, int]

SUBSCRIBING, LIVE, DONE = "subscribing", "live", "done"
#: a busy consumer stays with one hot producer for this many times max_demand events
STICK_FOR = 20
#: the work a busy consumer asks for at once, in seconds at its measured pace
PREFETCH_SECONDS = 0.05
#: weight of the newest sample in the pace's moving average
EWMA = 0.3


class _Upstream:
    __slots__ = ("asked_at", "hot", "out", "retracting", "state", "touched")

    def __init__(self) -> None:
        self.state = SUBSCRIBING
        self.out = 0             # units asked here and neither received nor given back
        self.retracting = False  # a RETRACT is unanswered
        self.hot = False         # its last delivery met all our demand: it may have more
        self.asked_at = -1       # sequence number of our last ask (least recently asked)
        self.touched = 0         # ``received_total`` when demand here last moved


class DemandBudget:
    """One consumer's ``max_demand`` units, placed at and retracted from its upstreams.

    Upstreams are numbered in :meth:`add` order.  The owner reports what happens (a
    subscription confirmed or lost, events received, events handled, an answer to a
    retract, being idle) and sends the actions each call returns.
    """

    def __init__(self, max_demand: int, min_demand: int, *, index: int = 0,
                 report_busy: bool = True, timed: bool = False) -> None:
        if max_demand < 1 or not 0 <= min_demand < max_demand:
            raise ValueError(f"need 0 <= min_demand < max_demand, got {min_demand}/{max_demand}")
        self.max_demand = max_demand
        #: freed units gathered before a busy consumer asks again (GenStage's threshold)
        self.chunk = max_demand - min_demand
        #: retract elsewhere on the first events after idle (the spread policy)
        self.report_busy = report_busy
        self.held = 0
        self.is_idle = True
        #: back-pressure from the stage's own output: ask nothing, retracting is fine
        self.backpressured = False
        self.offset = index * max_demand
        self.received_total = 0
        #: events received beyond what was out (only a dead producer's frames can do that)
        self.strays = 0
        #: times the consumer went idle (each one re-spreads its demand)
        self.idles = 0
        #: events given back unstarted (RETURN)
        self.given_back = 0
        #: set by the first events after idle, cleared by the owner once it has gathered
        #: what else its idle spread drew in (see :meth:`keep`)
        self.woke = False
        #: measured seconds per handled event (moving average), None until measured;
        #: setting it (or :attr:`timed`) recomputes the prefetch, read several times a frame
        self._seconds_per_event: float | None = None
        #: the owner passes ``seconds`` to :meth:`finished` (see :meth:`prefetch`)
        self.timed = timed
        self._busy_since = 0
        self._ups: list[_Upstream] = []
        self._out = 0                        # sum of every upstream's out
        self._next_stale_scan = 0
        self._seq = 0
        self._last_probe: int | None = None
        #: the hot producer a busy consumer sticks to, and events taken from it since
        self._current: int | None = None
        self._stuck = 0
        #: events after which a busy consumer moves on to the next hot producer
        self.stick = STICK_FOR * max_demand

    # -- what the owner reports -----------------------------------------------------------
    def add(self) -> int:
        """A new upstream, not subscribed yet (no demand until :meth:`subscribed`)."""
        self._ups.append(_Upstream())
        return len(self._ups) - 1

    def subscribed(self, i: int) -> list[Action]:
        """SUBSCRIBED arrived: the producer holds exactly no demand of ours."""
        u = self._ups[i]
        self._out -= u.out
        u.state, u.out, u.retracting, u.hot = LIVE, 0, False, False
        u.touched = self.received_total
        return self._place()

    def unsubscribed(self, i: int) -> list[Action]:
        """We subscribe again (the producer restarted): what was out there is void."""
        u = self._ups[i]
        self._out -= u.out
        u.state, u.out, u.retracting, u.hot = SUBSCRIBING, 0, False, False
        return self._place()

    def done(self, i: int) -> list[Action]:
        """The upstream cancelled (finished, or refused us): its demand is void."""
        u = self._ups[i]
        self._out -= u.out
        u.state, u.out, u.retracting, u.hot = DONE, 0, False, False
        return self._place()

    def received(self, i: int, n: int) -> list[Action]:
        """``n`` events from upstream ``i`` arrived (call before handling them)."""
        u = self._ups[i]
        self.held += n
        was_idle, self.is_idle = self.is_idle, False
        if was_idle:
            self._busy_since = self.received_total
            self.woke = True
        if u.state != LIVE:
            self.strays += n
            return []
        if n > u.out:                       # a correct producer never does this
            self.strays += n - u.out
            n = u.out
        u.out -= n
        self._out -= n
        self.received_total += n
        u.touched = self.received_total
        if i == self._current:
            self._stuck += n
        if not u.out and not u.retracting:
            u.hot = True
        acts = []
        if was_idle and self.report_busy:
            acts = [self._retract(j) for j, v in self._live()
                    if j != i and v.out and not v.retracting]
        return acts + self._trim()

    def finished(self, n: int, seconds: float | None = None) -> list[Action]:
        """``n`` held events were handled (in ``seconds``, if measured): their units are
        free again."""
        if n > self.held:
            raise ValueError(f"finished {n} events but only {self.held} are held")
        self.held -= n
        if seconds is not None and n:
            sample = max(seconds, 0.0) / n
            spe = self.seconds_per_event
            self.seconds_per_event = sample if spe is None else spe + EWMA * (sample - spe)
        return self._place()

    def prefetch(self) -> int:
        """How many events a busy consumer keeps in hand and on order: about
        ``PREFETCH_SECONDS`` of work at the measured pace, between 1 and ``max_demand``.
        Short events get whole frames (throughput); long jobs are taken one at a time, so
        a backlog of them is shared by every consumer that frees up instead of queueing
        behind one.  A timed consumer (:attr:`timed`) takes one at a time until its first
        frame is measured; an untimed one gets GenStage's ``max_demand``."""
        return self._prefetch

    @property
    def seconds_per_event(self) -> float | None:
        return self._seconds_per_event

    @seconds_per_event.setter
    def seconds_per_event(self, spe: float | None) -> None:
        self._seconds_per_event = spe
        self._set_prefetch()

    @property
    def timed(self) -> bool:
        return self._timed

    @timed.setter
    def timed(self, timed: bool) -> None:
        self._timed = timed
        self._set_prefetch()

    def _set_prefetch(self) -> None:
        spe = self._seconds_per_event
        if spe is None:
            self._prefetch = 1 if self.timed else self.max_demand
        elif not spe:
            self._prefetch = self.max_demand
        else:
            self._prefetch = max(1, min(self.max_demand, int(PREFETCH_SECONDS / spe)))

    def returned(self, n: int) -> list[Action]:
        """``n`` held events were given back unstarted (RETURN): their units are free, and
        their producer dispatches them again, to a consumer that can start them."""
        if n > self.held:
            raise ValueError(f"returned {n} events but only {self.held} are held")
        self.held -= n
        self.given_back += n
        return self._place()

    def keep(self, waiting: int) -> int:
        """Of ``waiting`` received events not yet started, how many to keep; the rest
        go back (RETURN).  Only long jobs shed: the prefetch allows one, and the others
        should go to whichever consumer is free first, not wait behind this one.  Jobs
        that arrive from several producers at once (before this consumer's busy report
        reached them) are the case; the spread policy only (a partition's events have
        nowhere else to go)."""
        if not self.report_busy:
            return waiting
        return min(waiting, self.prefetch())

    def retracted(self, i: int, k: int) -> list[Action]:
        """RETRACTED ``k`` from upstream ``i``; an answer nobody waits for is ignored."""
        u = self._ups[i]
        if u.state != LIVE or not u.retracting:
            return []
        k = min(k, u.out)
        u.out -= k
        self._out -= k
        u.retracting = False
        return self._place()

    def idle(self) -> list[Action]:
        """Nothing arrived for a while and nothing is held: spread to the idle targets."""
        if self.held:
            return []
        self.is_idle = True
        self.idles += 1
        return self._rebalance()

    def rotate(self) -> list[Action]:
        """With more producers than units, move an idle consumer's cover to the next ones,
        so a producer no idle consumer covers is not left waiting forever."""
        if not self.needs_rotation:
            return []
        self.offset += self.max_demand
        return self._rebalance() if self.is_idle else []

    def set_backpressure(self, on: bool) -> list[Action]:
        self.backpressured = on
        return [] if on else self._place()

    # -- views ----------------------------------------------------------------------------
    @property
    def free(self) -> int:
        return self.max_demand - self.held - self._out

    def out(self, i: int) -> int:
        return self._ups[i].out

    def state(self, i: int) -> str:
        return self._ups[i].state

    def retracting(self, i: int) -> bool:
        return self._ups[i].retracting

    @property
    def needs_rotation(self) -> bool:
        return sum(1 for u in self._ups if u.state != DONE) > self.max_demand

    def targets(self) -> dict[int, int]:
        """Idle placement: upstream → units, even over the upstreams not done, in rank
        order (deficits are filled in that order).

        Every consumer of a producer gets the same share there (the remainder goes to the
        first upstreams), so the producer sees its idle consumers level and starts K
        simultaneous jobs on K of them.  With more upstreams than units a consumer covers
        ``max_demand`` of them, one unit each, from its offset (its index times
        ``max_demand``), so siblings cover different producers, and :meth:`rotate` moves
        the cover.  An upstream still subscribing keeps its share (it is not asked until
        SUBSCRIBED): otherwise every confirmation at start-up would move demand."""
        alive = [i for i, u in enumerate(self._ups) if u.state != DONE]
        if not alive:
            return {}
        base, extra = divmod(self.max_demand, len(alive))
        start = self.offset % len(alive) if not base else 0
        ranked = alive[start:] + alive[:start]
        return {i: base + (r < extra) for r, i in enumerate(ranked)}

    # -- placement ------------------------------------------------------------------------
    def _live(self) -> Iterable[tuple[int, _Upstream]]:
        return ((i, u) for i, u in enumerate(self._ups) if u.state == LIVE)

    def _ask(self, i: int, n: int) -> Action:
        u = self._ups[i]
        u.out += n
        self._out += n
        u.hot = False
        u.asked_at = self._seq
        self._seq += 1
        u.touched = self.received_total
        return (ASK, i, n)

    def _retract(self, i: int, n: int | None = None) -> Action:
        u = self._ups[i]
        u.retracting = True
        u.hot = False
        return (RETRACT, i, u.out if n is None else n)

    def _place(self) -> list[Action]:
        return self._rebalance() if self.is_idle else self._busy()

    def _rebalance(self) -> list[Action]:
        targets = self.targets()
        acts = [self._retract(i, self._ups[i].out - want) for i, want in targets.items()
                if not self._ups[i].retracting and self._ups[i].out > want]
        if not self.backpressured:
            acts += self._fill(targets, self.free)
        return acts

    def _fill(self, targets: dict[int, int], free: int) -> list[Action]:
        acts = []
        for i, want in targets.items():
            u = self._ups[i]
            if free <= 0:
                break
            if u.state == LIVE and not u.retracting and u.out < want:
                n = min(want - u.out, free)
                acts.append(self._ask(i, n))
                free -= n
        return acts

    def _trim(self) -> list[Action]:
        """Busy with long jobs (spread policy): demand beyond the prefetch is retracted, so
        producers give those jobs to consumers that can start them now."""
        if not self.report_busy:
            return []
        excess = self.held + self._out - self.prefetch()
        if excess <= 0:
            return []
        acts = []
        for i, u in self._live():
            if excess <= 0:
                break
            if u.out and not u.retracting:
                n = min(u.out, excess)
                acts.append(self._retract(i, n))
                excess -= n
        return acts

    def _busy(self) -> list[Action]:
        now = self.received_total
        ups = self._ups
        acts: list[Action] = []
        if now >= self._next_stale_scan:      # a scan every max_demand / 2 events is enough
            self._next_stale_scan = now + max(1, self.max_demand // 2)
            stale = now - self.max_demand
            acts = [self._retract(i) for i, u in enumerate(ups)
                    if u.out and not u.retracting and u.touched <= stale and u.state == LIVE]
        acts += self._trim()
        if self.backpressured:
            return acts
        want = self.prefetch()
        # work in hand and on order stays within the prefetch (and the budget)
        room = min(self.free, want - self.held - self._out)
        if room < min(self.chunk, want):
            return acts
        cur = self._current
        if (cur is not None and ups[cur].hot and not ups[cur].retracting
                and self._stuck < self.stick):
            target = cur
        else:
            hot = [i for i, u in enumerate(ups)
                   if u.hot and u.state == LIVE and not u.retracting]
            if not hot:
                return acts + self._fill(self.targets(), room)
            others = [i for i in hot if i != cur] or hot
            target = min(others, key=lambda j: ups[j].asked_at)
            self._current, self._stuck = target, 0
        every = 2 * self.max_demand
        if room > 1 and now - self._busy_since >= every and (
                self._last_probe is None or now - self._last_probe >= every):
            self._last_probe = now
            cold = [i for i, u in enumerate(ups)
                    if u.state == LIVE and not u.hot and not u.out and not u.retracting]
            if cold:
                acts.append(self._ask(min(cold, key=lambda j: ups[j].asked_at), 1))
                room -= 1
        acts.append(self._ask(target, room))
        return acts

