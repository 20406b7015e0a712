"""Batch accumulation: Broadway's size / timeout / flush rules, per key.

The property tests replay random traffic against a model that holds each key's pending
items with their arrival times; every emitted batch must be exactly the front of its
key's pending items, which checks exactly-once and order in one go."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from offbroadway.stages.flow.batching import BatchAccumulator


def test_count_batches_by_size() -> None:
    acc: BatchAccumulator[str, int] = BatchAccumulator(3, 1.0)
    assert acc.add_many([("a", 1), ("a", 2)], now=0.0) == []
    assert len(acc) == 2 and acc.next_deadline() == 1.0
    out = acc.add_many([("a", 3), ("b", 10), ("a", 4), ("a", 5), ("a", 6), ("a", 7)], now=0.5)
    assert out == [("a", [1, 2, 3], "size"), ("a", [4, 5, 6], "size")]
    assert len(acc) == 2                             # a: [7] since 0.5, b: [10] since 0.5
    assert acc.next_deadline() == 1.5
    assert acc.add_many([("c", i) for i in range(3)], now=0.6) == [("c", [0, 1, 2], "size")]


def test_timeout_starts_at_the_first_item() -> None:
    acc: BatchAccumulator[str, int] = BatchAccumulator(10, 1.0)
    acc.add_many([("a", 1)], now=0.0)
    acc.add_many([("b", 2)], now=0.4)
    acc.add_many([("a", 3)], now=0.9)                # does not restart a's timer
    assert acc.expire(0.99) == []
    assert acc.expire(1.0) == [("a", [1, 3], "timeout")]
    assert acc.next_deadline() == 1.4
    assert acc.expire(5.0) == [("b", [2], "timeout")]
    assert acc.next_deadline() is None and len(acc) == 0


def test_a_full_batch_restarts_the_timer_for_the_rest() -> None:
    acc: BatchAccumulator[str, int] = BatchAccumulator(2, 1.0)
    acc.add_many([("a", 1)], now=0.0)
    acc.add_many([("b", 9)], now=0.2)
    assert acc.add_many([("a", 2), ("a", 3)], now=0.5) == [("a", [1, 2], "size")]
    assert acc.next_deadline() == 1.2                # b is now the oldest partial
    assert acc.expire(1.2) == [("b", [9], "timeout")]
    assert acc.expire(1.5) == [("a", [3], "timeout")]


def test_flush_emits_every_partial_batch() -> None:
    acc: BatchAccumulator[str, int] = BatchAccumulator(10, 60.0)
    acc.add_many([("a", 1), ("b", 2), ("a", 3)], now=0.0)
    assert acc.flush() == [("a", [1, 3], "flush"), ("b", [2], "flush")]
    assert acc.flush() == [] and len(acc) == 0 and acc.add_many([], 1.0) == []


def test_a_clock_that_goes_back_is_held() -> None:
    acc: BatchAccumulator[str, int] = BatchAccumulator(10, 1.0)
    acc.add_many([("a", 1)], now=5.0)
    acc.add_many([("b", 2)], now=4.0)                # treated as 5.0
    assert acc.next_deadline() == 6.0
    assert acc.expire(6.0) == [("a", [1], "timeout"), ("b", [2], "timeout")]


def test_budget_batches() -> None:
    acc: BatchAccumulator[str, str] = BatchAccumulator(10, 1.0, size_of=len)
    assert acc.add_many([("k", "aaaa"), ("k", "bbbb")], now=0.0) == []
    out = acc.add_many([("k", "ccc"), ("k", "dd")], now=0.1)
    assert out == [("k", ["aaaa", "bbbb"], "size")]     # "ccc" would make 11
    assert acc.add_many([("k", "eeeee")], now=0.2) == [("k", ["ccc", "dd", "eeeee"], "size")]
    assert len(acc) == 0


def test_budget_oversized_item_is_a_batch_of_its_own() -> None:
    acc: BatchAccumulator[str, str] = BatchAccumulator(5, 1.0, size_of=len)
    out = acc.add_many([("k", "ab"), ("k", "x" * 12), ("k", "cd"), ("k", "y" * 6)], now=0.0)
    assert out == [("k", ["ab"], "size"), ("k", ["x" * 12], "size"),
                   ("k", ["cd"], "size"), ("k", ["y" * 6], "size")]
    assert len(acc) == 0


def test_bad_settings() -> None:
    with pytest.raises(ValueError):
        BatchAccumulator(0, 1.0)
    with pytest.raises(ValueError):
        BatchAccumulator(1, -1.0)
    acc: BatchAccumulator[str, int] = BatchAccumulator(5, 1.0, size_of=lambda x: x)
    with pytest.raises(ValueError, match="negative"):
        acc.add_many([("k", -1)], now=0.0)


# -- properties ------------------------------------------------------------------------------

frames = st.lists(st.one_of(
    st.tuples(st.just("add"), st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 9)),
                                       max_size=25),
              st.floats(0, 1.5)),
    st.tuples(st.just("expire"), st.floats(0, 1.5)),
), max_size=25)


def replay(acc: BatchAccumulator, script: list[tuple], budget: int | None) -> None:
    """Check each emitted batch against the model and the rules; flush at the end."""
    size_of = acc.size_of or (lambda _: 1)
    limit = acc.batch_size
    pending: dict[str, deque] = {k: deque() for k in "abc"}   # (item, arrival time)
    now = 0.0
    serial = 0

    def check(batches: list[tuple[Any, list, str]], trigger_ok: set[str]) -> None:
        for key, batch, trigger in batches:
            assert trigger in trigger_ok and batch
            front = [pending[key].popleft() for _ in batch]
            assert batch == [item for item, _ in front], "exactly once, in order"
            total = sum(map(size_of, batch))
            assert total <= limit or len(batch) == 1, "within batch_size / budget"
            if trigger == "size":
                if budget is None:
                    assert len(batch) == limit
                else:                       # full, oversized, or the next did not fit
                    nxt = pending[key][0][0] if pending[key] else None
                    assert total >= limit or (nxt is not None and total + size_of(nxt) > limit)
            elif trigger == "timeout":
                assert front[0][1] + acc.batch_timeout <= now

    for op in script:
        now += op[-1]
        if op[0] == "add":
            items = []
            for key, weight in op[1]:
                items.append((key, (serial, weight)))
                serial += 1
                pending[key].append(((serial - 1, weight), now))
            check(acc.add_many(items, now), {"size"})
            for q in pending.values():      # what is left is never a full batch
                held = sum(size_of(item) for item, _ in q)
                assert held < limit or (budget is None and not q)
        else:
            check(acc.expire(now), {"timeout"})
            deadline = acc.next_deadline()
            assert deadline is None or deadline > now, "nothing overdue after expire"
        firsts = [q[0][1] for q in pending.values() if q]
        expect = min(firsts) + acc.batch_timeout if firsts else None
        assert acc.next_deadline() == expect
        assert len(acc) == sum(map(len, pending.values()))
    check(acc.flush(), {"flush"})
    assert len(acc) == 0 and all(not q for q in pending.values())


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 7), st.floats(0, 2), frames)
def test_counted_batches_property(size: int, timeout: float, script: list[tuple]) -> None:
    replay(BatchAccumulator(size, timeout), script, budget=None)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 20), st.floats(0, 2), frames)
def test_budget_batches_property(budget: int, timeout: float, script: list[tuple]) -> None:
    acc: BatchAccumulator = BatchAccumulator(budget, timeout, size_of=lambda it: it[1])
    replay(acc, script, budget=budget)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=12), st.integers(1, 25),
       st.booleans())
def test_blocks_batch_as_rows_do(frames: list[int], batch_size: int, resize: bool) -> None:
    """The batcher's counted batches grow by whole columns (a frame's events as one
    :class:`Block`): every event comes out once, in order, in the batches rows would
    make, and each batch's frame carries exactly its events."""
    from offbroadway.stages.wire import events as ev
    from offbroadway.stages.wire import protocol

    def block(first: int, n: int) -> ev.Block:
        rows = ev.encode_rows([(0, first + i, f"m{first + i}", first + i, {})
                               for i in range(n)])
        return protocol.open_events(protocol.decode(protocol.events(rows))[3])

    by_block: BatchAccumulator = BatchAccumulator(batch_size, 60.0)
    by_rows: BatchAccumulator = BatchAccumulator(batch_size, 60.0)
    got: list = []
    want: list = []
    first = 0
    for n in frames:
        b = block(first, n)
        got += by_block.add_run("k", b, 0.0)
        want += by_rows.add_run("k", b.rows(), 0.0)
        first += n
    if resize:
        got += by_block.resize(max(1, batch_size // 2), 60.0)
        want += by_rows.resize(max(1, batch_size // 2), 60.0)
    got += by_block.flush()
    want += by_rows.flush()
    assert [(b.trigger, list(b.items.ids)) for b in got] == \
        [(b.trigger, [r[2] for r in b.items]) for b in want]
    assert [i for b in got for i in b.items.ids] == [f"m{i}" for i in range(first)]
    for b in got:
        sent = protocol.open_events(protocol.decode(protocol.batch("k", b.trigger,
                                                                   b.items))[3])
        assert sent.rows() == b.items.rows()
