"""A stage's tally file (its counts, kept as they change) and the daemon's reading of it
when the stage's process has exited: the counts a SIGKILL kept it from reporting."""

from __future__ import annotations

import os
from pathlib import Path

from offbroadway.daemon.core.status import Board
from offbroadway.stages.runtime import tally


class _Topology:
    producers = ["producer_0"]


def test_the_counts_are_read_back_once_and_only_for_their_process(tmp_path: Path) -> None:
    path = tally.path(str(tmp_path), "producer_0")
    t = tally.Tally(path, 4242)
    assert tally.take(path, 4242) is None, "nothing written yet reads as nothing"
    t.write({"acked": 7, "in": 9, "other": 1})
    assert tally.take(path, 99) is None, "another process's counts"
    counts = tally.take(path, 4242)
    assert counts is not None and counts["acked"] == 7 and counts["in"] == 9
    assert "other" not in counts
    assert not os.path.exists(path)
    assert tally.take(path, 4242) is None


def test_a_write_cut_short_reads_as_nothing(tmp_path: Path) -> None:
    path = tally.path(str(tmp_path), "p")
    t = tally.Tally(path, 1)
    t.write({"acked": 3})
    t._mm[tally.STATE_AT] = tally.WRITING      # killed in the middle of the next write
    assert tally.take(path, 1) is None


def test_a_successor_starts_from_nothing(tmp_path: Path) -> None:
    path = tally.path(str(tmp_path), "p")
    tally.Tally(path, 1).write({"acked": 3})
    tally.Tally(path, 2)
    assert tally.take(path, 1) is None and tally.take(path, 2) is None


def test_last_words_count_what_the_last_report_missed_once() -> None:
    board = Board(_Topology())  # type: ignore[arg-type]
    board.record("producer_0", {"pid": 1, "acked": 10, "in": 20, "source": {"unacked": 3}})
    # SIGKILLed after 15 more acks: its tally has them, no report came
    board.last_words("producer_0", 1, {"acked": 25, "in": 30})
    assert board.sum(["producer_0"], "acked") == 25
    assert board.source("producer_0") == {"unacked": 3}
    # its successor counts from zero
    board.record("producer_0", {"pid": 2, "acked": 5})
    assert board.sum(["producer_0"], "acked") == 30
    # a clean exit's own last report, arriving after the tally was taken, adds nothing
    board.last_words("producer_0", 2, {"acked": 8})
    board.record("producer_0", {"pid": 2, "acked": 8})
    assert board.sum(["producer_0"], "acked") == 33
