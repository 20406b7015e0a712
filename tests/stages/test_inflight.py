"""The in-flight table: each emitted message is settled or requeued exactly once, and
acks that name nothing in flight (stale, duplicate, garbage) are counted, never fatal."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from offbroadway.stages.flow.inflight import InFlightTable


def test_settle_acks_and_fails() -> None:
    t: InFlightTable[str] = InFlightTable()
    t.add_many([(1, "a"), (2, "b"), (3, "c")])
    assert len(t) == 3 and 2 in t
    ok, failed = t.settle([1, 3], [(2, "boom")])
    assert ok == ["a", "c"] and failed == [("b", "boom")]
    assert len(t) == 0 and t.unknown == 0


def test_unknown_and_duplicate_tokens_are_counted_not_fatal() -> None:
    t: InFlightTable[str] = InFlightTable()
    t.add_many((tok, f"h{tok}") for tok in range(5))
    ok, failed = t.settle([0, 0, 99], [(1, "x"), (1, "again"), (0, "late")])
    assert ok == ["h0"] and failed == [("h1", "x")]
    assert t.unknown == 4 and len(t) == 3


def test_garbage_from_the_wire_is_unknown() -> None:
    t: InFlightTable[str] = InFlightTable()
    t.add_many([(1, "a"), (2, "b")])
    ok, failed = t.settle([[1], {"x": 1}, None, "1"], [[2], (2,), (2, "r", 3), 2, [2, 7]])
    assert ok == [] and failed == [("b", "7")]
    assert t.unknown == 8 and len(t) == 1 and [1] not in t


def test_take_all_requeues_everything_oldest_first() -> None:
    t: InFlightTable[int] = InFlightTable()
    t.add_many([(5, 50), (6, 60)])
    t.add_many([(7, 70)])
    assert t.take_all() == [50, 60, 70]
    assert len(t) == 0 and t.take_all() == []
    assert t.settle([5], []) == ([], [])   # an ack after the requeue: unknown
    assert t.unknown == 1


def test_a_reused_token_is_a_bug_and_changes_nothing() -> None:
    t: InFlightTable[str] = InFlightTable()
    t.add_many([(1, "a")])
    with pytest.raises(ValueError, match="already in flight"):
        t.add_many([(2, "b"), (1, "a2")])
    with pytest.raises(ValueError):
        t.add_many([(3, "c"), (3, "c2")])
    assert len(t) == 1 and t.settle([1], []) == (["a"], [])


actions = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 8)),
    st.tuples(st.just("settle"), st.lists(st.integers(-3, 60)), st.lists(st.integers(-3, 60))),
    st.tuples(st.just("take_all")),
), max_size=30)


@settings(max_examples=200, deadline=None)
@given(actions)
def test_every_handle_comes_out_exactly_once(script: list[tuple]) -> None:
    t: InFlightTable[str] = InFlightTable()
    live: set[int] = set()
    out: list[str] = []
    added: list[str] = []
    unknown = 0
    next_token = 0
    for op in script:
        if op[0] == "add":
            entries = [(tok, f"h{tok}") for tok in range(next_token, next_token + op[1])]
            next_token += op[1]
            t.add_many(entries)
            live.update(tok for tok, _ in entries)
            added += [h for _, h in entries]
        elif op[0] == "settle":
            ok, failed = t.settle(op[1], [(tok, f"r{tok}") for tok in op[2]])
            expect_ok = []
            for tok in op[1]:
                if tok in live:
                    live.discard(tok)
                    expect_ok.append(f"h{tok}")
                else:
                    unknown += 1
            expect_failed = []
            for tok in op[2]:
                if tok in live:
                    live.discard(tok)
                    expect_failed.append((f"h{tok}", f"r{tok}"))
                else:
                    unknown += 1
            assert ok == expect_ok and failed == expect_failed
            out += ok + [h for h, _ in failed]
        else:
            taken = t.take_all()
            assert taken == [f"h{tok}" for tok in sorted(live)]
            live.clear()
            out += taken
        assert len(t) == len(live) and t.unknown == unknown
    out += t.take_all()
    assert sorted(out) == sorted(added) and len(set(out)) == len(out)


def test_add_range_takes_fresh_tokens_only_and_settles_like_add_many() -> None:
    table: InFlightTable[str] = InFlightTable()
    assert table.add_range(100, ["a", "b", "c"]) == 3
    with pytest.raises(ValueError):
        table.add_range(102, ["x"])                 # 102 was issued already
    assert len(table) == 3
    table.add_many([(500, "d")])
    with pytest.raises(ValueError):
        table.add_range(200, ["y"])                 # below a token add_many took
    assert table.add_range(501, iter(["e"])) == 1
    assert table.settle([100, 102, 501, 7], [[101, "bad"]]) == (["a", "c", "e"], [("b", "bad")])
    assert table.unknown == 1 and len(table) == 1
