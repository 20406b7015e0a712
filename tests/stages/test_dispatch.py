"""Dispatchers: GenStage's demand rules, idle-first spreading, partitions.

Every dispatcher is checked against the same contract with random operation sequences
(conservation, order, never more than asked, one delivery per consumer per call); the
spread dispatcher is also checked against a per-event greedy reference, because its
per-consumer arithmetic is what makes it cheap and is the easiest part to get wrong.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from offbroadway.stages.flow.dispatch import (
    GenStageDemandDispatcher,
    PartitionDispatcher,
    SpreadDispatcher,
)

C = [f"processor_default_{i}".encode() for i in range(8)]


def fresh(dispatcher: Any, consumers: list[bytes], max_demand: int = 10,
          ask: int | None = None) -> Any:
    for c in consumers:
        dispatcher.subscribe(c, max_demand)
        dispatcher.ask(c, max_demand if ask is None else ask)
    return dispatcher


def counts(deliveries: list[tuple[bytes, list]]) -> dict[bytes, int]:
    return {c: len(evs) for c, evs in deliveries}


# -- GenStage's DemandDispatcher: faithful, light-load problem included ---------------------

def test_genstage_light_load_goes_to_the_first_subscriber() -> None:
    # single events: C0 (10), then C1..C3 (10 > 9), then FIFO among the equal nines
    d = fresh(GenStageDemandDispatcher(), C[:4])
    picks = [d.dispatch([i])[0][0][0] for i in range(5)]
    assert picks == [C[0], C[1], C[2], C[3], C[0]]


def test_genstage_gives_a_frame_to_the_biggest_demand() -> None:
    d = fresh(GenStageDemandDispatcher(), C[:4])
    deliveries, left = d.dispatch(list(range(3)))
    assert deliveries == [(C[0], [0, 1, 2])]          # the seed-003 behaviour
    deliveries, left = d.dispatch(list(range(25)))
    assert counts(deliveries) == {C[1]: 10, C[2]: 10, C[3]: 5}
    assert d.demand == 40 - 28 and left == []
    d.ask(C[0], 10)                                    # 7 + 10 = 17: now the biggest
    assert d.dispatch([0])[0] == [(C[0], [0])]


def test_genstage_fifo_among_equal_demands_after_ask() -> None:
    d = fresh(GenStageDemandDispatcher(), C[:3], ask=5)
    d.ask(C[0], 0)          # re-inserted behind the others with the same demand
    assert d.consumers() == [C[1], C[2], C[0]]


def test_genstage_one_delivery_per_consumer() -> None:
    d = fresh(GenStageDemandDispatcher(), C[:2], max_demand=600)
    deliveries, left = d.dispatch(list(range(1000)))
    assert counts(deliveries) == {C[0]: 600, C[1]: 400} and left == []


# -- SpreadDispatcher: idle-first ----------------------------------------------------------

def test_spread_light_load_goes_to_distinct_consumers() -> None:
    d = fresh(SpreadDispatcher(), C[:4])
    deliveries, left = d.dispatch(list(range(3)))
    assert left == [] and sorted(counts(deliveries).values()) == [1, 1, 1]


def test_spread_heavy_load_one_frame_per_consumer() -> None:
    d = fresh(SpreadDispatcher(), C[:2], max_demand=1000)
    deliveries, left = d.dispatch(list(range(1000)))
    assert counts(deliveries) == {C[0]: 500, C[1]: 500} and left == []
    d = fresh(SpreadDispatcher(), C[:2], max_demand=600)
    deliveries, left = d.dispatch(list(range(1500)))
    assert counts(deliveries) == {C[0]: 600, C[1]: 600} and left == list(range(1200, 1500))
    assert d.demand == 0
    assert d.dispatch(left) == ([], left)


def test_spread_slices_keep_order_and_the_idlest_gets_the_oldest() -> None:
    d = fresh(SpreadDispatcher(), C[:3])
    d.dispatch([0, 1])                 # C0 and C1 now have 9 left, C2 has 10
    deliveries, _ = d.dispatch(list(range(4)))
    assert deliveries[0] == (C[2], [0, 1])      # level C2 with the others first
    assert sorted(deliveries[1:]) == [(C[0], [2]), (C[1], [3])]


def test_spread_serves_idle_before_busy() -> None:
    d = fresh(SpreadDispatcher(), C[:2])
    d.dispatch(list(range(12)))        # 6 each, 4 left each
    d.ask(C[1], 6)                     # C1 finished: 10 left; C0 is still busy (4 left)
    deliveries, _ = d.dispatch(list(range(6)))
    assert deliveries == [(C[1], list(range(6)))]
    deliveries, _ = d.dispatch(list(range(3)))
    assert counts(deliveries) == {C[0]: 1, C[1]: 2} or counts(deliveries) == {C[0]: 2, C[1]: 1}


def test_spread_compares_load_relative_to_max_demand() -> None:
    d = SpreadDispatcher()
    d.subscribe(C[0], 100)
    d.subscribe(C[1], 10)
    d.ask(C[0], 60)                    # 60 % of its max free
    d.ask(C[1], 10)                    # fully idle
    deliveries, _ = d.dispatch(list(range(4)))
    assert deliveries == [(C[1], [0, 1, 2, 3])]   # C1 down to 60 %: level with C0
    deliveries, _ = d.dispatch(list(range(11)))
    assert counts(deliveries) == {C[0]: 10, C[1]: 1}


def test_spread_offsets_make_producers_pick_different_consumers() -> None:
    producers = [fresh(SpreadDispatcher(offset=i), C[:4]) for i in range(4)]
    picks = [p.dispatch(["ev"])[0][0][0] for p in producers]
    assert len(set(picks)) == 4
    # GenStage: every producer sends its one event to the same processor (seed 003)
    genstage = [fresh(GenStageDemandDispatcher(), C[:4]) for _ in range(4)]
    assert len({p.dispatch(["ev"])[0][0][0] for p in genstage}) == 1


def test_spread_order_does_not_depend_on_subscription_order() -> None:
    a = fresh(SpreadDispatcher(offset=1), C[:4])
    b = fresh(SpreadDispatcher(offset=2), list(reversed(C[:4])))
    assert a.consumers() == b.consumers()
    assert a.dispatch([0])[0][0][0] != b.dispatch([0])[0][0][0]


def test_spread_rotates_among_equals_over_calls() -> None:
    d = fresh(SpreadDispatcher(), C[:3], max_demand=1)
    picks = []
    for i in range(6):                 # max_demand 1: each re-asks after its event
        (consumer, _), = d.dispatch([i])[0]
        picks.append(consumer)
        d.ask(consumer, 1)
    assert picks == [C[0], C[1], C[2], C[0], C[1], C[2]]


def test_spread_subscription_lifecycle() -> None:
    d = fresh(SpreadDispatcher(), C[:2])
    with pytest.raises(KeyError):
        d.ask(b"stranger", 1)
    with pytest.raises(ValueError, match="ask"):
        d.ask(C[0], -1)
    with pytest.raises(ValueError, match="max_demand"):
        d.subscribe(C[2], 0)
    d.cancel(C[0])
    d.cancel(C[0])                     # twice, or unknown: ignored
    assert d.demand == 10 and d.consumers() == [C[1]]
    d.subscribe(C[1], 5)               # a restarted consumer: starts afresh
    assert d.demand == 0 and d.demand_of(C[1]) == 0
    assert d.dispatch([1, 2]) == ([], [1, 2])
    d.ask(C[1], 5)
    assert d.dispatch([1, 2]) == ([(C[1], [1, 2])], [])


def test_empty_dispatchers() -> None:
    for d in (SpreadDispatcher(), GenStageDemandDispatcher(),
              PartitionDispatcher([0], lambda x: 0)):
        assert d.dispatch([1]) == ([], [1])
        assert d.demand == 0 and d.consumers() == []
        d.subscribe(C[0], 3, 0)
        d.ask(C[0], 3)
        assert d.dispatch([]) == ([], [])


# -- PartitionDispatcher -------------------------------------------------------------------

def parity() -> PartitionDispatcher:
    return PartitionDispatcher(["even", "odd"], lambda x: "odd" if x % 2 else "even")


def test_partition_routes_by_key_and_keeps_order() -> None:
    d = parity()
    d.subscribe(C[0], 10, "even")
    d.subscribe(C[1], 10, "odd")
    d.ask(C[0], 10)
    d.ask(C[1], 2)
    assert d.demand == 12
    deliveries, left = d.dispatch(list(range(10)))
    assert dict(deliveries) == {C[0]: [0, 2, 4, 6, 8], C[1]: [1, 3]}
    assert left == [5, 7, 9] and d.demand == 5
    assert d.partition_demand("odd") == 0 and d.partition_of(C[1]) == "odd"


def test_partition_without_consumer_waits_in_leftovers() -> None:
    d = parity()
    d.subscribe(C[0], 10, "even")
    d.ask(C[0], 10)
    deliveries, left = d.dispatch([1, 2, 3, 4])
    assert deliveries == [(C[0], [2, 4])] and left == [1, 3]


def test_partition_shared_by_consumers_spreads() -> None:
    d = PartitionDispatcher([0], lambda x: 0)
    for c in C[:3]:
        d.subscribe(c, 10, 0)
        d.ask(c, 10)
    deliveries, _ = d.dispatch([1, 2, 3])
    assert len(deliveries) == 3


def test_partition_rejects_unknown_partitions_without_changing_state() -> None:
    d = parity()
    with pytest.raises(ValueError, match="unknown partition"):
        d.subscribe(C[0], 10, "prime")
    with pytest.raises(ValueError, match="unknown partition"):
        d.subscribe(C[0], 10, ["unhashable"])
    d.subscribe(C[0], 10, "even")
    d.ask(C[0], 10)
    bad = PartitionDispatcher(["even"], lambda x: "even" if x % 2 == 0 else "odd")
    bad.subscribe(C[0], 10, "even")
    bad.ask(C[0], 10)
    with pytest.raises(ValueError, match="unknown partition"):
        bad.dispatch([0, 1])
    assert bad.demand == 10 and bad.demand_of(C[0]) == 10


def test_partition_cancel_and_resubscribe_elsewhere() -> None:
    d = parity()
    d.subscribe(C[0], 10, "even")
    d.ask(C[0], 10)
    d.subscribe(C[0], 10, "odd")
    assert d.demand == 0 and d.partition_demand("even") == 0
    d.ask(C[0], 1)
    d.cancel(C[0])
    d.cancel(b"stranger")
    assert d.demand == 0 and d.consumers() == []


# -- the contract, under random operation sequences -----------------------------------------

ops = st.lists(st.one_of(
    st.tuples(st.just("subscribe"), st.integers(0, 5), st.integers(1, 12),
              st.integers(0, 2)),
    st.tuples(st.just("ask"), st.integers(0, 5), st.integers(0, 15)),
    st.tuples(st.just("cancel"), st.integers(0, 5)),
    st.tuples(st.just("dispatch"), st.integers(0, 60)),
), max_size=40)


def run_contract(d: Any, script: list[tuple], partition_of: Any = None) -> None:
    """Drive ``d`` and check every dispatch against a model of the demand."""
    demand: dict[bytes, int] = {}
    part: dict[bytes, int] = {}
    buffer: list[int] = []
    serial = 0
    for op in script:
        if op[0] == "subscribe":
            c = C[op[1]]
            d.subscribe(c, op[2], op[3])
            demand[c], part[c] = 0, op[3]
        elif op[0] == "ask":
            c = C[op[1]]
            if c in demand:
                d.ask(c, op[2])
                demand[c] += op[2]
            else:
                with pytest.raises(KeyError):
                    d.ask(c, op[2])
        elif op[0] == "cancel":
            d.cancel(C[op[1]])
            demand.pop(C[op[1]], None)
        else:
            items = buffer + list(range(serial, serial + op[1]))
            serial += op[1]
            deliveries, left = d.dispatch(items)
            seen = [c for c, _ in deliveries]
            assert len(seen) == len(set(seen)), "one delivery per consumer per call"
            delivered = []
            for c, evs in deliveries:
                assert evs, "no empty deliveries"
                assert len(evs) <= demand[c], "never more than asked"
                assert evs == sorted(evs), "order kept per consumer"
                if partition_of is not None:
                    assert all(partition_of(e) == part[c] for e in evs)
                demand[c] -= len(evs)
                delivered += evs
            assert sorted(delivered + left) == items, "conservation"
            assert left == sorted(left), "leftovers in order"
            if partition_of is None:
                # work-conserving: leftovers only when every demand is used up
                assert not left or sum(demand.values()) == 0
                assert len(delivered) == min(len(items), sum(demand.values()) + len(delivered))
            else:
                for e in left:          # a leftover's partition had no room left
                    assert all(demand[c] == 0 for c in demand if part[c] == partition_of(e))
            buffer = left
        assert d.demand == sum(demand.values())
        assert sorted(d.consumers()) == sorted(demand)


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(0, 7))
def test_spread_contract(script: list[tuple], offset: int) -> None:
    run_contract(SpreadDispatcher(offset), script)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_genstage_contract(script: list[tuple]) -> None:
    run_contract(GenStageDemandDispatcher(), script)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_partition_contract(script: list[tuple]) -> None:
    def key(x: int) -> int:
        return x * 7 % 3
    run_contract(PartitionDispatcher(range(3), key), script, partition_of=key)


# -- idle-first properties -----------------------------------------------------------------

def greedy_reference(state: list[tuple[bytes, int, int]], n: int, start: int) -> dict:
    """One event at a time to the highest remaining/max, ties in rotation from ``start``
    over the consumers sorted by id: the definition the fast allocation must match."""
    order = sorted(state)
    rot = order[start % len(order):] + order[:start % len(order)]
    rem = {c: r for c, r, _ in rot}
    mx = {c: m for c, _, m in rot}
    got: dict[bytes, int] = {}
    for _ in range(n):
        live = [c for c, _, _ in rot if rem[c]]
        if not live:
            break
        best = max(live, key=lambda c: Fraction(rem[c], mx[c]))
        rem[best] -= 1
        got[best] = got.get(best, 0) + 1
    return got


consumer_states = st.lists(
    st.tuples(st.integers(1, 30), st.integers(0, 30)).map(lambda mr: (mr[0], min(mr))),
    min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(consumer_states, st.integers(0, 120), st.integers(0, 7))
def test_spread_matches_greedy_reference(states: list[tuple[int, int]], n: int,
                                         offset: int) -> None:
    d = SpreadDispatcher(offset)
    for c, (m, r) in zip(C, states):
        d.subscribe(c, m)
        d.ask(c, r)
    state = [(c, r, m) for c, (m, r) in zip(C, states)]
    deliveries, _ = d.dispatch(list(range(n)))
    assert counts(deliveries) == greedy_reference(state, n, offset)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.data())
def test_spread_fresh_consumers_get_one_each(c: int, data: st.DataObject) -> None:
    k = data.draw(st.integers(1, c))
    m = data.draw(st.integers(1, 20))
    offset = data.draw(st.integers(0, 100))
    d = fresh(SpreadDispatcher(offset), C[:c], max_demand=m)
    deliveries, left = d.dispatch(list(range(k)))
    assert len(deliveries) == k and left == []
    assert all(len(evs) == 1 for _, evs in deliveries)


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 8), st.data())
def test_spread_different_offsets_pick_differently(c: int, data: st.DataObject) -> None:
    o1, o2 = data.draw(st.lists(st.integers(0, c - 1), min_size=2, max_size=2, unique=True))
    asks = data.draw(st.lists(st.integers(0, 10), min_size=c, max_size=c))
    m = data.draw(st.integers(1, 10))
    state = []
    for o in (o1, o2):
        d = SpreadDispatcher(offset=o)
        for consumer, a in zip(C[:c], asks):
            d.subscribe(consumer, m)
            d.ask(consumer, a)
        state.append(d)
    if sum(asks) == 0:
        return
    best = max(asks)
    first = [d.dispatch([0])[0][0][0] for d in state]
    tied = [consumer for consumer, a in zip(C[:c], asks) if a == best]
    assert all(p in tied for p in first)
    if len(tied) == c:                 # equal state: the offsets decide
        assert first[0] != first[1]


@settings(max_examples=200, deadline=None)
@given(consumer_states, st.integers(1, 120))
def test_spread_levels_load(states: list[tuple[int, int]], n: int) -> None:
    """Water-filling: nobody left with more free share than someone who was served."""
    d = SpreadDispatcher()
    for c, (m, r) in zip(C, states):
        d.subscribe(c, m)
        d.ask(c, r)
    deliveries, _ = d.dispatch(list(range(n)))
    got = counts(deliveries)
    served = [Fraction(r - got[c] + 1, m) for c, (m, r) in zip(C, states) if got.get(c)]
    unserved = [Fraction(r - got.get(c, 0), m) for c, (m, r) in zip(C, states)
                if r - got.get(c, 0) > 0]
    if served and unserved:
        assert min(served) >= max(unserved)
