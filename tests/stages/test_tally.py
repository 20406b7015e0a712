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
    t.flushed({"acked": 5, "in": 9})
    t.write({"acked": 7, "in": 9, "other": 1})
    assert tally.take(path, 99) is None, "another process's counts"
    words = tally.take(path, 4242)
    assert words is not None and words.counts["acked"] == 7 and words.counts["in"] == 9
    assert "other" not in words.counts
    assert words.unpublished() == {"acked": 2}
    assert not os.path.exists(path)
    assert tally.take(path, 4242) is None


def test_the_acked_slot_stands_for_the_acked_count(tmp_path: Path) -> None:
    path = tally.path(str(tmp_path), "producer_0")
    t = tally.Tally(path, 7)
    slot = t.acked_slot()
    t.write({"acked": 3, "in": 10})       # a report's figures
    slot[0] = 9                           # acks applied since (or sent, by the source)
    words = tally.take(path, 7)
    assert words is not None and words.counts["acked"] == 9 and words.counts["in"] == 10


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
    # its reports read only after its tally was taken (still in the hub's socket when
    # its exit was seen) are no later than the tally: they change no count
    board.last_words("producer_0", 2, {"acked": 8})
    board.record("producer_0", {"pid": 2, "acked": 6, "source": {"unacked": 0}})
    assert board.sum(["producer_0"], "acked") == 33
    assert board.source("producer_0") == {"unacked": 0}
    board.record("producer_0", {"pid": 3, "acked": 1})
    assert board.sum(["producer_0"], "acked") == 34


def test_a_source_with_its_own_failure_books_keeps_its_failed_count() -> None:
    board = Board(_Topology())  # type: ignore[arg-type]
    board.record("producer_0", {"pid": 1, "failed": 2, "source": {"failures": 5}})
    board.last_words("producer_0", 1, {"failed": 9, "acked": 4})
    assert board.sum(["producer_0"], "failed") == 2
    assert board.sum(["producer_0"], "acked") == 4


def test_unpublished_metrics_by_sample_name() -> None:
    from offbroadway.daemon.shell.app import unpublished_metrics

    words = tally.LastWords({"acked": 10, "failed": 3, "in": 12, "out": 12},
                            {"acked": 4, "failed": 1, "in": 12, "out": 13})
    assert unpublished_metrics("producer_0", words, own_books=False) == {
        "offbroadway_messages_acked_total": 6, "offbroadway_messages_failed_total": 2}
    assert unpublished_metrics("producer_0", words, own_books=True) == {
        "offbroadway_messages_acked_total": 6}
    assert unpublished_metrics("producer_0", None, own_books=False) == {}
