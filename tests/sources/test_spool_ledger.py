"""The spool's ack ledger (stages/sources/spool/ledger.py), a pure core: what a record says
is exactly the set of lines the settle calls wrote, whatever their order and grouping, a
torn last write included; the reading cursor skips exactly those lines."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st
from offbroadway.stages.sources.spool import ledger

LINES = st.integers(min_value=1, max_value=300)
#: settle calls: each a non-empty set of line numbers (acks come in any grouping)
CALLS = st.lists(st.sets(LINES, min_size=1, max_size=40), max_size=12)
#: pure functions, but the machine is shared: a 200 ms per-example deadline failed one
#: example that took 357 ms under a load of 10 (the examples still run, unbounded)
unhurried = settings(deadline=None)


def record_text(calls: list[set[int]], head: str = "123:45") -> str:
    return ledger.header(head) + "".join(ledger.ranges_line(sorted(c)) for c in calls)


def covered(ranges: ledger.Ranges) -> set[int]:
    return {n for lo, hi in ranges for n in range(lo, hi + 1)}


def well_formed(ranges: ledger.Ranges) -> bool:
    """Sorted, each lo <= hi, disjoint and not adjacent (merged as far as they go)."""
    return all(lo <= hi for lo, hi in ranges) and all(
        a[1] + 1 < b[0] for a, b in pairwise(ranges))


@unhurried
@given(CALLS)
def test_a_record_reads_back_as_exactly_the_settled_lines(calls: list[set[int]]) -> None:
    rec = ledger.parse(record_text(calls).encode())
    assert rec.head == "123:45"
    assert not rec.done and not rec.unreadable
    assert covered(rec.ranges) == set().union(*calls)
    assert well_formed(rec.ranges)
    assert rec.whole == len(record_text(calls).encode())


@unhurried
@given(CALLS, st.sets(LINES, min_size=1, max_size=40), st.data())
def test_a_torn_last_write_is_not_read(calls: list[set[int]], torn: set[int],
                                       data: st.DataObject) -> None:
    intact = record_text(calls).encode()
    last = ledger.ranges_line(sorted(torn)).encode()
    cut = data.draw(st.integers(min_value=1, max_value=len(last) - 1))   # no newline left
    rec = ledger.parse(intact + last[:cut])
    assert rec.whole == len(intact)
    assert covered(rec.ranges) == set().union(*calls)


@unhurried
@given(CALLS)
def test_the_done_mark_is_read(calls: list[set[int]]) -> None:
    rec = ledger.parse((record_text(calls) + ledger.DONE_MARK + "\n").encode())
    assert rec.done
    assert covered(rec.ranges) == set().union(*calls)


@unhurried
@given(st.lists(st.tuples(LINES, LINES).map(sorted).map(tuple), max_size=30))
def test_merge_keeps_the_union_and_joins_what_touches(ranges: list[tuple[int, int]]) -> None:
    merged = ledger.merge(ranges)
    assert covered(merged) == covered(ranges)
    assert well_formed(merged)


@unhurried
@given(CALLS)
def test_the_cursor_skips_exactly_the_settled_lines(calls: list[set[int]]) -> None:
    """Driven as the reader's hot loop drives it: asked only from ``next_skip`` on."""
    settled = set().union(*calls)
    cursor = ledger.SettledCursor(ledger.merge([(n, n) for n in settled]))
    skipped = set()
    for lineno in range(1, 320):
        if lineno >= cursor.next_skip and cursor.settled(lineno):
            skipped.add(lineno)
    assert skipped == settled


def test_unreadable_entries_are_reported_and_the_rest_kept() -> None:
    rec = ledger.parse(b"#offbroadway-spool-acked v1 head=1:9\n1-3 x 5\n0 7-6 9\n")
    assert rec.unreadable == ["x"]
    assert rec.ranges == [(1, 3), (5, 5), (9, 9)]     # 0 and 7-6 are not line ranges
