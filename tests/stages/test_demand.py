"""The demand budget (stages/flow/demand.py) against real dispatchers, over modelled channels.

A small network of producers (the real dispatchers, as the ROUTER side drives them: ASK,
RETRACT → RETRACTED, SUBSCRIBE → SUBSCRIBED, "unknown subscription" for a stranger) and
consumers (the real :class:`DemandBudget`), joined by one FIFO queue per direction and
pair, because that is all ZeroMQ promises (order per connection).  Hypothesis picks which
frame moves next, when events arrive, when consumers finish, go idle, hold back, die and
come back, and when producers restart; after every step the invariants are checked:

* budget: a consumer never has more than ``max_demand`` events in hand plus on the wire
  to it, summed over its producers;
* never more than asked: per subscription, events sent ≤ asked − retracted;
* exactness: for every confirmed subscription the consumer's ``out`` equals the
  producer's demand plus what is on the wire between them (asks, events, RETRACTED);
* conservation: at the end, after everything settles, every event was handled exactly
  once (or, with consumer deaths, returned to its producer and handled once later).

Idle-first has its own properties: simultaneous jobs on distinct consumers, and a busy
consumer no longer offered work by any producer once its retractions have landed.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from offbroadway.stages.flow.demand import ASK, LIVE, DemandBudget
from offbroadway.stages.flow.dispatch import (
    GenStageDemandDispatcher,
    PartitionDispatcher,
    SpreadDispatcher,
)
from offbroadway.stages.flow.window import PacedWindow


def cid(c: int) -> bytes:
    return f"processor_default_{c}".encode()


class Net:
    """Producers and budgeted consumers over per-pair FIFO channels."""

    def __init__(self, producers: int, consumers: int, max_demand: int = 10,
                 min_demand: int = 5, policy: str = "spread") -> None:
        self.P, self.C, self.B, self.m = producers, consumers, max_demand, min_demand
        self.policy = policy
        self.disp: list[Any] = [self._dispatcher(p) for p in range(producers)]
        self.buffer: list[list[int]] = [[] for _ in range(producers)]
        self.up: dict[tuple[int, int], deque] = {}
        self.down: dict[tuple[int, int], deque] = {}
        self.held: list[list[tuple[int, int]]] = [[] for _ in range(consumers)]
        self.handled: Counter = Counter()
        self.serial = 0
        self.origin: dict[int, int] = {}
        # producer side, per (c, p) and subscription: asked, retracted, sent
        self.books: dict[tuple[int, int], list[int]] = {}
        self.strays_possible = False
        self.ref: Counter = Counter()      # (c, p) → ref of the consumer's latest SUBSCRIBE
        self.budgets: list[DemandBudget] = [self._consumer(c) for c in range(consumers)]

    def _dispatcher(self, p: int) -> Any:
        if self.policy == "demand":
            return GenStageDemandDispatcher()
        if self.policy == "partition":
            return PartitionDispatcher(range(self.C), lambda e: e % self.C)
        return SpreadDispatcher(offset=p)

    def _consumer(self, c: int) -> DemandBudget:
        b = DemandBudget(self.B, self.m, index=c, report_busy=self.policy == "spread")
        for p in range(self.P):
            b.add()
            self.ref[c, p] += 1
            self.up[c, p] = deque([("sub", self.ref[c, p])])
            self.down[c, p] = deque()
        return b

    # -- moving things ----------------------------------------------------------------------
    def send(self, c: int, actions: list) -> None:
        for kind, p, n in actions:
            assert n > 0, "no empty asks or retracts"
            self.up[c, p].append((kind, n))

    def arrive(self, p: int, k: int) -> None:
        for _ in range(k):
            self.origin[self.serial] = p
            self.buffer[p].append(self.serial)
            self.serial += 1
        self.dispatch(p)

    def dispatch(self, p: int) -> None:
        deliveries, left = self.disp[p].dispatch(self.buffer[p])
        self.buffer[p] = list(left)
        for consumer, evs in deliveries:
            c = int(consumer.rsplit(b"_", 1)[1])
            books = self.books[c, p]
            books[2] += len(evs)
            assert books[2] <= books[0] - books[1], "a producer sent more than was asked"
            self.down[c, p].append(("events", list(evs)))

    def to_producer(self, c: int, p: int) -> bool:
        q = self.up[c, p]
        if not q:
            return False
        frame = q.popleft()
        d = self.disp[p]
        if frame[0] == "sub":
            d.subscribe(cid(c), self.B, c if self.policy == "partition" else None)
            self.books[c, p] = [0, 0, 0]
            self.down[c, p].append(("subscribed", frame[1]))
        elif frame[0] == ASK:
            try:
                d.ask(cid(c), frame[1])
                self.books[c, p][0] += frame[1]
            except KeyError:
                self.down[c, p].append(("cancel", "unknown subscription"))
        elif frame[0] == "return":
            self.buffer[p] = list(frame[1]) + self.buffer[p]
        else:
            try:
                k = d.retract(cid(c), frame[1])
                assert k <= frame[1]
                self.books[c, p][1] += k
                self.down[c, p].append(("retracted", k))
            except KeyError:
                self.down[c, p].append(("cancel", "unknown subscription"))
        self.dispatch(p)
        return True

    def to_consumer(self, c: int, p: int) -> bool:
        q = self.down[c, p]
        if not q:
            return False
        frame = q.popleft()
        b = self.budgets[c]
        if frame[0] == "subscribed":
            if frame[1] == self.ref[c, p]:     # else it answers an earlier SUBSCRIBE
                self.send(c, b.subscribed(p))
        elif frame[0] == "events":
            self.send(c, b.received(p, len(frame[1])))
            self.held[c].extend((p, e) for e in frame[1])
        elif frame[0] == "retracted":
            self.send(c, b.retracted(p, frame[1]))
        else:        # the producer restarted: void what was out (the daemon resubscribes)
            self.send(c, b.unsubscribed(p))
        return True

    def resubscribe(self, c: int, p: int) -> None:
        self.send(c, self.budgets[c].unsubscribed(p))
        self.ref[c, p] += 1
        self.up[c, p].append(("sub", self.ref[c, p]))

    def finish(self, c: int, k: int) -> None:
        k = min(k, len(self.held[c]))
        if not k:
            return
        done, self.held[c] = self.held[c][:k], self.held[c][k:]
        for _, e in done:
            self.handled[e] += 1
        self.budgets[c].backpressured = False
        self.send(c, self.budgets[c].finished(k))

    def shed(self, c: int) -> None:
        """Give back what the budget will not keep of the events received, not started:
        the newest go back, each to its producer, in one RETURN per producer."""
        b = self.budgets[c]
        keep = b.keep(len(self.held[c]))
        if keep >= len(self.held[c]):
            return
        self.held[c], back = self.held[c][:keep], self.held[c][keep:]
        by_p: dict[int, list[int]] = {}
        for p, e in back:
            by_p.setdefault(p, []).append(e)
        for p, evs in by_p.items():
            self.up[c, p].append(("return", evs))
            self.send(c, b.returned(len(evs)))

    def idle(self, c: int) -> None:
        if not self.held[c]:
            self.send(c, self.budgets[c].idle())

    def rotate(self, c: int) -> None:
        self.send(c, self.budgets[c].rotate())

    def hold(self, c: int, on: bool) -> None:
        self.send(c, self.budgets[c].set_backpressure(on))

    def kill_consumer(self, c: int) -> None:
        """The process dies: what it held and what was on the wire to it goes back to its
        producers (the daemon requeues; a failed send returns a share), its frames die
        with it, and a new incarnation subscribes afresh."""
        back: dict[int, list[int]] = {}
        for p, e in self.held[c]:
            back.setdefault(p, []).append(e)
        for p in range(self.P):
            for frame in self.down[c, p]:
                if frame[0] == "events":
                    back.setdefault(p, []).extend(frame[1])
            for frame in self.up[c, p]:        # given back, lost with it: requeued
                if frame[0] == "return":
                    back.setdefault(p, []).extend(frame[1])
            self.disp[p].cancel(cid(c))
            self.books.pop((c, p), None)
        self.held[c] = []
        for p, evs in back.items():
            self.buffer[p] = sorted(evs) + self.buffer[p]
        self.budgets[c] = self._consumer(c)
        for p in range(self.P):
            self.dispatch(p)

    def restart_producer(self, p: int) -> None:
        """A new incarnation with no subscriptions; frames already on the wire from the
        old one still arrive (strays), frames to it reach the new one."""
        self.disp[p] = self._dispatcher(p)
        for c in range(self.C):
            self.books.pop((c, p), None)
        self.strays_possible = True

    # -- invariants -------------------------------------------------------------------------
    def on_wire(self, c: int, p: int) -> int:
        return sum(len(f[1]) for f in self.down[c, p] if f[0] == "events")

    def check(self) -> None:
        for c, b in enumerate(self.budgets):
            in_hand = len(self.held[c]) + sum(self.on_wire(c, p) for p in range(self.P))
            assert b.held == len(self.held[c])
            assert b.free == self.B - b.held - sum(b.out(p) for p in range(self.P))
            if not self.strays_possible:
                assert b.strays == 0
                assert in_hand <= self.B, f"consumer {c} holds {in_hand} > max_demand"
                assert b.held + sum(b.out(p) for p in range(self.P)) <= self.B
            for p in range(self.P):
                self._check_exact(c, p, b)

    def _check_exact(self, c: int, p: int, b: DemandBudget) -> None:
        if b.state(p) != LIVE or (c, p) not in self.books:
            return
        if any(f[0] == "sub" for f in self.up[c, p]) or any(
                f[0] in ("subscribed", "cancel") for f in self.down[c, p]) or (
                self.strays_possible and self.budgets[c].strays):
            return
        d = self.disp[p]
        try:
            demand = d.demand_of(cid(c))
        except KeyError:
            return
        asked, retracted, sent = self.books[c, p]
        assert demand == asked - retracted - sent
        wire = (self.on_wire(c, p) + sum(f[1] for f in self.up[c, p] if f[0] == ASK)
                + sum(f[1] for f in self.down[c, p] if f[0] == "retracted"))
        assert b.out(p) == demand + wire, "the consumer's account drifted from the producer's"

    # -- settling ---------------------------------------------------------------------------
    def quiesce(self) -> None:
        moved = True
        while moved:
            moved = False
            for c in range(self.C):
                for p in range(self.P):
                    while self.to_producer(c, p):
                        moved = True
                    while self.to_consumer(c, p):
                        moved = True
            self.check()

    def settle(self, patience: int = 20) -> None:
        """Arrivals over: finish, go idle, rotate, until every event is handled; fail when
        ``patience`` rounds in a row handle nothing (events stranded)."""
        for c in range(self.C):
            self.hold(c, False)
        stuck = 0
        while stuck < patience:
            before = sum(self.handled.values())
            self.quiesce()
            for c in range(self.C):
                self.finish(c, len(self.held[c]))
            self.quiesce()
            for c in range(self.C):
                self.idle(c)
            self.quiesce()
            if not any(self.buffer) and not any(self.held):
                return
            for c in range(self.C):
                self.rotate(c)
            stuck = 0 if sum(self.handled.values()) > before else stuck + 1
        raise AssertionError(f"events stranded: buffers {self.buffer}, held {self.held}")


# -- the network under random schedules -------------------------------------------------------

def step_strategy(P: int, C: int) -> st.SearchStrategy:
    c, p = st.integers(0, C - 1), st.integers(0, P - 1)
    return st.one_of(
        st.tuples(st.just("arrive"), p, st.integers(1, 25)),
        st.tuples(st.just("up"), c, p),
        st.tuples(st.just("up"), c, p),
        st.tuples(st.just("down"), c, p),
        st.tuples(st.just("down"), c, p),
        st.tuples(st.just("finish"), c, st.integers(1, 12)),
        st.tuples(st.just("idle"), c),
        st.tuples(st.just("shed"), c),
        st.tuples(st.just("pace"), c, st.sampled_from([None, 0.00003, 0.5])),
        st.tuples(st.just("rotate"), c),
        st.tuples(st.just("hold"), c, st.booleans()),
        st.tuples(st.just("kill"), c),
        st.tuples(st.just("restart"), p),
    )


@st.composite
def scenarios(draw: Any, restarts: bool = False) -> tuple:
    P = draw(st.integers(1, 4))
    C = draw(st.integers(1, 4))
    B = draw(st.integers(1, 12))
    m = draw(st.integers(0, B - 1))
    policy = draw(st.sampled_from(["spread", "spread", "partition"]))
    steps = draw(st.lists(step_strategy(P, C), max_size=80))
    if not restarts:
        steps = [s for s in steps if s[0] != "restart"]
    return P, C, B, m, policy, steps


def play(P: int, C: int, B: int, m: int, policy: str, steps: list) -> Net:
    net = Net(P, C, B, m, policy)
    for step in steps:
        kind = step[0]
        if kind == "arrive":
            net.arrive(step[1], step[2])
        elif kind == "up":
            net.to_producer(step[1], step[2])
        elif kind == "down":
            net.to_consumer(step[1], step[2])
        elif kind == "finish":
            net.finish(step[1], step[2])
        elif kind == "idle":
            net.idle(step[1])
        elif kind == "shed":
            net.shed(step[1])
        elif kind == "pace":                  # the glue's timing of handled frames
            net.budgets[step[1]].timed = step[2] is not None
            net.budgets[step[1]].seconds_per_event = step[2]
        elif kind == "rotate":
            net.rotate(step[1])
        elif kind == "hold":
            net.hold(step[1], step[2])
        elif kind == "kill":
            net.kill_consumer(step[1])
        else:
            net.restart_producer(step[1])
            for c in range(C):          # the daemon's "resubscribe" command
                net.resubscribe(c, step[1])
        net.check()
    return net


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_budget_exactness_and_conservation(scenario: tuple) -> None:
    net = play(*scenario)
    net.settle()
    assert set(net.handled) == set(range(net.serial)), "an event was never handled"
    assert max(net.handled.values(), default=1) == 1, "an event was handled twice"


@settings(max_examples=200, deadline=None)
@given(scenarios(restarts=True))
def test_producer_restarts_lose_nothing(scenario: tuple) -> None:
    """A producer that restarts voids the demand it held; nothing is lost and the
    accounts meet again (a dead incarnation's frames on the wire may still arrive)."""
    net = play(*scenario)
    net.settle()
    assert set(net.handled) == set(range(net.serial))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 12), st.data())
def test_plain_genstage_producers_keep_the_budget(P: int, C: int, B: int,
                                                  data: st.DataObject) -> None:
    """The budget needs nothing of the dispatcher but demand and retract."""
    steps = data.draw(st.lists(step_strategy(P, C), max_size=60))
    net = play(P, C, B, B // 2, "demand", [s for s in steps if s[0] != "restart"])
    net.settle()
    assert set(net.handled) == set(range(net.serial))


# -- idle-first ---------------------------------------------------------------------------------

def settled(P: int, C: int, B: int = 10) -> Net:
    net = Net(P, C, B, B // 2)
    net.settle()
    return net


def receivers(net: Net) -> list[int]:
    """Consumers with events on the wire to them, one entry per event frame."""
    return [c for (c, _), q in net.down.items() for f in q if f[0] == "events"]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10), st.integers(1, 10), st.data())
def test_simultaneous_jobs_at_one_producer_start_on_distinct_consumers(
        P: int, C: int, data: st.DataObject) -> None:
    p = data.draw(st.integers(0, P - 1))
    k = data.draw(st.integers(1, C))
    net = settled(P, C)
    if P > 10:
        return
    net.arrive(p, k)
    got = receivers(net)
    assert sorted(got) == sorted(set(got)) and len(got) == k


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10), st.data())
def test_one_job_per_producer_at_once_lands_on_distinct_consumers(
        P: int, data: st.DataObject) -> None:
    """Seed 003's scenario: every producer gets one job at the same instant (no frame
    moves in between); the offsets make them pick different idle consumers."""
    C = data.draw(st.integers(P, 10))
    net = settled(P, C)
    for p in range(P):
        net.arrive(p, 1)
    got = receivers(net)
    assert len(got) == P and len(set(got)) == P


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10), st.integers(2, 10), st.data())
def test_a_busy_consumer_is_offered_nothing_while_others_idle(
        P: int, C: int, data: st.DataObject) -> None:
    """Once a consumer's first events arrived and its retractions landed, the next job at
    any producer goes to an idle consumer."""
    p1 = data.draw(st.integers(0, P - 1))
    p2 = data.draw(st.integers(0, P - 1))
    net = settled(P, C)
    net.arrive(p1, 1)
    (busy,) = receivers(net)
    while net.to_consumer(busy, p1):           # it starts the job: reports busy
        pass
    for p in range(P):
        while net.to_producer(busy, p):
            pass
    net.arrive(p2, 1)
    got = [c for (c, pp), q in net.down.items() if pp == p2
           for f in q if f[0] == "events"]
    assert len(got) == 1 and got[0] != busy


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 10), st.integers(2, 10), st.data())
def test_a_consumer_busy_with_a_long_job_keeps_no_demand_anywhere(
        P: int, C: int, data: st.DataObject) -> None:
    """Long jobs (a timed consumer before its first measurement, or a slow pace): once
    its retractions landed, no producer holds demand of the busy consumer at all, so
    nothing more queues behind its job."""
    p1 = data.draw(st.integers(0, P - 1))
    net = settled(P, C)
    for b in net.budgets:
        b.timed = True
    net.arrive(p1, 1)
    (busy,) = receivers(net)
    while net.to_consumer(busy, p1):
        pass
    for p in range(P):
        while net.to_producer(busy, p):
            pass
    assert all(net.disp[p].demand_of(cid(busy)) == 0 for p in range(P))


def test_targets_spread_evenly_and_level_across_consumers() -> None:
    nets = [DemandBudget(10, 5, index=i) for i in range(3)]
    for b in nets:
        for p in range(4):
            b.add()
            b.subscribed(p)
    for b in nets:
        t = b.targets()
        assert sum(t.values()) == 10 and sorted(t.values()) == [2, 2, 3, 3]
    # a producer sees its idle consumers level
    assert len({tuple(sorted(b.targets().items())) for b in nets}) == 1


def test_with_more_producers_than_units_siblings_cover_different_producers() -> None:
    nets = [DemandBudget(3, 1, index=i) for i in range(3)]
    for b in nets:
        for p in range(9):
            b.add()
            b.subscribed(p)
    covers = [{p for p, n in b.targets().items() if n} for b in nets]
    assert all(len(c) == 3 for c in covers) and set().union(*covers) == set(range(9))


def test_more_producers_than_units_rotate_the_cover() -> None:
    b = DemandBudget(4, 2, index=0)
    for _ in range(10):
        b.add()
    asked: set[int] = set()
    for p in range(10):
        asked |= {i for kind, i, _ in b.subscribed(p) if kind == ASK}
    assert sum(b.targets().values()) == 4 and b.needs_rotation
    for _ in range(3):
        acts = b.rotate()
        while acts:                        # the producers answer every retract in full
            kind, i, n = acts.pop(0)
            if kind == ASK:
                asked.add(i)
            else:
                acts += b.retracted(i, n)
        assert sum(b.out(i) for i in range(10)) == 4
    assert asked == set(range(10)), "every producer is covered in turn"


# -- heavy load: demand follows events, frames stay big ----------------------------------------

@pytest.mark.parametrize("P", [1, 2, 10])
def test_heavy_load_keeps_frames_full_and_serves_every_producer(P: int) -> None:
    """Every producer has a backlog: after start-up the consumer's frames carry its whole
    budget, and over time it serves every producer (it sticks to one for a while, for
    frames and a warm producer, then moves on)."""
    net = Net(P, 1, 10, 5)
    net.quiesce()
    for p in range(P):
        net.arrive(p, 20000)
    sizes: list[int] = []
    served: Counter = Counter()
    for _ in range(3000):
        for p in range(P):
            while net.to_producer(0, p):
                pass
            if net.down[0, p]:
                f = net.down[0, p][0]
                if f[0] == "events":
                    sizes.append(len(f[1]))
                    served[p] += len(f[1])
                net.to_consumer(0, p)
        net.finish(0, len(net.held[0]))
        net.check()
    steady = sizes[len(sizes) // 10:]
    assert sum(steady) / len(steady) >= 9, f"frames of {sum(steady) / len(steady):.1f}"
    assert set(served) == set(range(P))


def test_demand_parked_at_an_empty_producer_moves_to_the_events() -> None:
    """Busy consumers whose demand waits at a producer that ran dry: the events that
    arrive elsewhere are still delivered (stale demand is retracted, idle re-spreads)."""
    net = Net(3, 2, 10, 5)
    net.quiesce()
    net.arrive(0, 400)
    for _ in range(200):
        net.quiesce()
        for c in range(2):
            net.finish(c, len(net.held[c]))
    assert not net.buffer[0]
    net.arrive(2, 7)
    net.settle()
    assert set(net.handled) == set(range(net.serial))


@pytest.mark.parametrize("P", [2, 10])
def test_a_backlog_of_long_jobs_is_shared_not_hoarded(P: int) -> None:
    """Busy consumers re-ask about PREFETCH_SECONDS of work at their measured pace: with
    0.5 s jobs that is one job, so a backlog at one producer is taken one job at a time
    by whichever consumer frees up, never ``max_demand`` at a time by the first one."""
    C = 10
    net = settled(P, C)
    for b in net.budgets:
        b.timed = True                            # as the processor's glue
    net.arrive(0, 3 * C)
    net.quiesce()
    first = [len(h) for h in net.held]
    assert max(first) - min(first) <= 1, "the burst itself is spread evenly"
    for _ in range(6 * C):
        for c in range(C):
            if net.held[c]:
                net.held[c], done = net.held[c][1:], net.held[c][:1]
                for _, e in done:
                    net.handled[e] += 1
                net.send(c, net.budgets[c].finished(1, seconds=0.5))
                net.quiesce()
                assert len(net.held[c]) <= max(1, first[c] - 1), "a long-job consumer hoarded"
        if not any(net.held) and not any(net.buffer):
            break
    assert sum(net.handled.values()) == 3 * C


def test_prefetch_follows_the_measured_pace() -> None:
    b = DemandBudget(10, 5)
    assert b.prefetch() == 10                     # nothing measured: whole frames
    b.add()
    b.subscribed(0)
    b.received(0, 10)
    b.finished(10, seconds=0.0003)                # 30 µs an event
    assert b.prefetch() == 10
    for _ in range(20):                           # then 0.5 s jobs
        b.received(0, 1)
        b.finished(1, seconds=0.5)
    assert b.prefetch() == 1


def test_long_jobs_that_met_on_one_consumer_are_given_back_to_idle_ones() -> None:
    """Two producers pick the same idle consumer within one round trip (no information
    can cross that fast); the consumer keeps one long job and RETURNs the other, which
    its producer hands to a consumer that is still idle."""
    net = settled(2, 4)
    for b in net.budgets:
        b.timed = True                      # the processor's glue: long until measured
    net.arrive(0, 2)                        # producer 0 picks consumers 0 and 1
    net.arrive(1, 1)                        # producer 1 picks consumer 1 as well
    assert sorted(receivers(net)) == [0, 1, 1]
    for p in range(2):
        net.to_consumer(1, p)
    net.shed(1)
    assert len(net.held[1]) == 1
    net.quiesce()                           # the RETURN lands, the job goes elsewhere
    holders = [c for c in range(4) if net.held[c]]
    assert len(holders) == 3 and all(len(net.held[c]) == 1 for c in holders)


# -- the dispatchers' retract --------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["spread", "demand", "partition"]),
       st.lists(st.tuples(st.integers(0, 2), st.integers(0, 15), st.integers(0, 15),
                          st.integers(0, 20)), max_size=30))
def test_retract_takes_back_only_unmet_demand(kind: str, script: list) -> None:
    if kind == "spread":
        d: Any = SpreadDispatcher()
    elif kind == "demand":
        d = GenStageDemandDispatcher()
    else:
        d = PartitionDispatcher(range(3), lambda e: e % 3)
    C3 = [cid(i) for i in range(3)]
    for i, c in enumerate(C3):
        d.subscribe(c, 10, i if kind == "partition" else None)
    demand = dict.fromkeys(C3, 0)
    serial = 0
    for who, ask, retract, n in script:
        c = C3[who]
        d.ask(c, ask)
        demand[c] += ask
        k = d.retract(c, retract)
        assert k == min(retract, demand[c])
        demand[c] -= k
        items = list(range(serial, serial + n))
        serial += n
        deliveries, _ = d.dispatch(items)
        for consumer, evs in deliveries:
            demand[consumer] -= len(evs)
            assert demand[consumer] >= 0
        assert d.demand == sum(demand.values())
        assert all(d.demand_of(x) == demand[x] for x in C3)
    with pytest.raises(KeyError):
        d.retract(b"stranger", 1)


# -- a batch processor's paced window ------------------------------------------------------


def test_paced_window_asks_one_batch_until_timed_then_follows_the_pace() -> None:
    w = PacedWindow(100, 50)
    assert w.subscribed() == 1                  # untimed: one (a sibling may still start)
    w.received(1)
    w.timed(1, 0.0001)                          # quick batches: the whole max_demand
    w.finished(1)
    assert w.asks() == 100
    w.received(100)
    for _ in range(100):
        w.timed(1, 0.2)                         # then slow ones: one at a time
    w.finished(100)
    assert w.window == 1 and w.asks() == 1 and w.asks() == 0
    w.received(1)
    w.finished(1)
    assert w.asks() == 1                        # min_demand 0: re-asked as soon as free


def test_paced_window_counts_batches_awaiting_their_commit_against_max_demand_only() -> None:
    w = PacedWindow(8, 4)
    w.subscribed()
    w.received(1)
    w.timed(1, 0.0)                             # handle_batch instant: window 8
    assert w.asks() == 7                        # one held (in a commit): 7 more at most
    w.received(7)
    assert w.asks() == 0                        # 8 held, none free
    w.finished(3)
    assert w.asks() == 0                        # 3 free: under the re-ask chunk of 4
    w.finished(1)
    assert w.asks() == 4


@given(st.lists(st.tuples(st.sampled_from(["recv", "fin", "time", "ask"]),
                          st.floats(0, 0.2)), max_size=200),
       st.integers(1, 50))
def test_paced_window_never_over_max_demand_nor_more_unstarted_than_the_window(
        steps: list[tuple[str, float]], max_demand: int) -> None:
    w = PacedWindow(max_demand, max_demand // 2)
    out = w.subscribed()                        # asked, not received (the batcher's view)
    for op, x in steps:
        if op == "recv" and out:
            w.received(1)
            out -= 1
        elif op == "fin" and w.held:
            w.finished(1)
        elif op == "time":
            w.timed(1, x)
        else:
            asked = w.asks()
            out += asked
            if asked:                           # an ask never leaves more unstarted
                assert out <= w.window          # than the window allows
        assert out == w.outstanding
        assert w.outstanding + w.held <= max_demand
