"""The committer's exactly-once bookkeeping (stages/spark/spark_once.py): journal, doubt, recent."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
from offbroadway.stages.spark.spark_once import KEEP, Doubt, Journal, RecentFiles, repeats


def test_the_journal_gives_back_the_last_stamps_and_stays_bounded(tmp_path: Path) -> None:
    j = Journal(str(tmp_path / "j" / "orders.spark"))
    assert j.last() == []
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    stamps = [t0 + timedelta(microseconds=i) for i in range(25 * KEEP)]
    for s in stamps:
        j.record(s)
    assert j.last(3) == stamps[-3:]
    assert len(j.path.read_text().split()) <= 10 * KEEP + 1
    # a torn last line (killed while writing it) is not a commit
    with open(j.path, "a") as f:
        f.write("2026-01-01T00:0")
    assert j.last(2) == stamps[-2:]
    # a new incarnation reads what the old one wrote, and its lines stay readable
    again = Journal(str(j.path))
    later = stamps[-1] + timedelta(seconds=1)
    again.record(later)
    assert again.last(2) == [stamps[-1], later]


def test_doubt_marks_rows_already_written_and_forgets_them_after_the_horizon() -> None:
    d = Doubt(horizon=100.0)
    ids = pa.array(["a", "b", "c"])
    assert not d.active(now=0.0) and d.mask(ids) is None
    d.add(pa.array(["b", "x"]), now=0.0)
    assert d.active(now=1.0)
    assert d.mask(ids).to_pylist() == [False, True, False]
    # a second copy of b (stale, then redelivered) is still in doubt
    assert d.mask(ids).to_pylist() == [False, True, False]
    table = pa.table({"v": [1, 2, 3], "message_id": ids})
    assert d.filter(table).column("message_id").to_pylist() == ["a", "c"]
    assert not d.active(now=200.0) and len(d) == 0, "past the horizon"


def test_a_watch_puts_what_is_committed_in_doubt_for_a_while() -> None:
    d = Doubt(horizon=100.0)
    d.committed(pa.array(["a"]))
    assert not d.active(), "no watch: committing puts nothing in doubt"
    d.watch(3)
    assert d.active() and d.watching
    d.committed(pa.chunked_array([["a", "b"]]))
    assert d.mask(pa.array(["a", "b", "c"])).to_pylist() == [True, True, False]
    d.committed(pa.array(["c", "d"]))
    assert not d.watching, "3 rows watched, 4 committed"
    d.committed(pa.array(["e"]))
    assert d.mask(pa.array(["d", "e"])).to_pylist() == [True, False]


def test_recent_files_keep_a_window_per_batch_processor() -> None:
    r = RecentFiles(batches=2)
    assert r.add(b"bp0", "f1") is None and r.add(b"bp0", "f2") is None
    assert r.add(b"bp0", "f3") == "f1"
    assert r.add(b"bp1", "g1") is None
    assert r.names() == {"f2", "f3", "g1"}
    assert r.pop(b"bp0") == ["f2", "f3"] and r.pop(b"bp0") == []


def lists(masks: list[pa.Array | None]) -> list[list[bool] | None]:
    return [None if m is None else m.to_pylist() for m in masks]


def test_a_message_twice_in_one_group_is_written_once_while_the_committer_checks() -> None:
    """After a requeue a stale copy and the redelivered copy can sit in one group (even
    one batch), neither in the dataset yet: the first is kept, the repeats left out, and
    the batches that lost a repeat are named (written only if the group is)."""
    ids = pa.array(["a", "b", "a", "c", "b", "b", "d"])
    assert repeats(ids).to_pylist() == [False, False, True, False, True, True, False]
    assert repeats(pa.array(["a", "b"])) is None and repeats(pa.array([], pa.string())) is None
    d = Doubt(horizon=100.0)
    group = [pa.array(["a", "b"]), pa.array(["a", "c", "b"]), pa.array(["b", "d"])]
    table = pa.table({"v": list(range(7)), "message_id": ids})
    assert d.filter(table) is None, "nothing in doubt, no watch: nothing checked"
    d.watch(10)
    masks, follows = d.check(group)
    assert lists(masks) == [None, [True, False, True], [True, False]]
    assert follows == {1, 2}
    assert d.filter(table).column("v").to_pylist() == [0, 1, 3, 6]
    d.add(pa.array(["c", "x"]), now=0.0)
    masks, follows = d.check(group)
    assert lists(masks) == [None, [True, True, True], [True, False]]
    assert d.check([pa.array(["d"]), pa.array(["e"])]) == ([None, None], set())
    assert d.filter(table).column("v").to_pylist() == [0, 1, 6]
