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


def test_a_write_cut_short_reads_as_the_write_before(tmp_path: Path) -> None:
    """A process killed in the middle of a write leaves the previous write whole: its
    acked slot and every count of it are read, not dropped with the torn copy."""
    path = tally.path(str(tmp_path), "p")
    t = tally.Tally(path, 1)
    slot = t.acked_slot()
    t.write({"acked": 3, "in": 5})
    slot[0] = 4
    # killed in the middle of the next write: half of the copy not in use written
    copy = 2 if t._mm[tally.COPY_OF["counts"]] == 1 else 1
    at = tally.COUNTS_AT + (copy - 1) * tally.VALUES.size
    t._mm[at:at + 8] = (99).to_bytes(8, "little")
    words = tally.take(path, 1)
    assert words is not None and words.counts["in"] == 5 and words.counts["acked"] == 4


def test_nothing_written_reads_as_nothing(tmp_path: Path) -> None:
    path = tally.path(str(tmp_path), "p")
    tally.Tally(path, 1).acked_slot()[0] = 3
    assert tally.take(path, 1) is None


def test_a_frame_killed_on_its_way_is_in_doubt_and_one_that_left_is_counted(
        tmp_path: Path) -> None:
    path = tally.path(str(tmp_path), "producer_0")
    t = tally.Tally(path, 5)
    book = t.sent_acks()
    t.write({"in": 100})
    book.leaving([11, 12, 13], 0)
    book.left(3)
    book.leaving([21, 22], 3)                # killed before this one was counted
    words = tally.take(path, 5)
    assert words is not None and words.counts["acked"] == 3
    assert words.doubt is not None and words.doubt.digests == (21, 22)
    t = tally.Tally(path, 6)
    book = t.sent_acks()
    t.write({"in": 100})
    book.leaving(list(range(40)), 0)
    book.left(40)                            # killed after: nothing in doubt
    words = tally.take(path, 6)
    assert words is not None and words.counts["acked"] == 40 and words.doubt is None


def test_a_frame_described_in_part_is_not_in_doubt(tmp_path: Path) -> None:
    """Killed after the digests and the size of a new frame were stored, before its base:
    the old frame's base no longer equals the count, so nothing reads as in doubt (the
    new frame had not left: its messages come back and are counted then)."""
    path = tally.path(str(tmp_path), "producer_0")
    t = tally.Tally(path, 5)
    book = t.sent_acks()
    t.write({})
    book.leaving([1, 2, 3, 4], 0)
    book.left(4)
    book._digests[:2] = tally.array("q", [8, 9])
    book._ints[1] = 2                        # the new frame's size; its base not yet
    words = tally.take(path, 5)
    assert words is not None and words.counts["acked"] == 4 and words.doubt is None


def test_a_process_sigkilled_between_its_ack_frame_and_the_count_leaves_it_in_doubt(
        tmp_path: Path) -> None:
    """A real process, its acks settled through the RabbitMQ source's settlement with a
    channel that "writes" the frame and is then SIGKILLed, as a kill landing after the
    write would: the daemon's reading of its tally finds the frame, with each message's
    digest, and the count without it."""
    import subprocess
    import sys
    import textwrap

    path = tally.path(str(tmp_path), "producer_0")
    child = textwrap.dedent(f"""
        import os, signal
        from offbroadway.stages.runtime import tally
        from offbroadway.stages.sources.rabbitmq.delivery import RabbitMQHandle
        from offbroadway.stages.sources.rabbitmq.settle import Settlement

        class Channel:
            frames = 0
            def basic_ack(self, tag, multiple=False):
                self.frames += 1
                if self.frames == 2:
                    os.kill(os.getpid(), signal.SIGKILL)

        t = tally.Tally({str(path)!r}, os.getpid())
        t.write({{}})
        settle = Settlement("reject_and_requeue")
        settle.sent_book = t.sent_acks()
        settle.attach(Channel(), 1)
        for tag in range(1, 11):
            settle.delivered(tag)
        settle.ack([RabbitMQHandle(1, tag, False, False, f"m{{tag}}") for tag in range(1, 5)])
        settle.send_acks()
        settle.ack([RabbitMQHandle(1, tag, False, False, f"m{{tag}}") for tag in range(5, 11)])
        settle.send_acks()
        raise SystemExit("not killed")
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONHASHSEED": "7"})
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -9, err
    words = tally.take(path, proc.pid)
    assert words is not None and words.counts["acked"] == 4
    assert words.doubt is not None
    digests = subprocess.run(
        [sys.executable, "-c", "print(*[hash(f'm{t}') for t in range(5, 11)])"],
        capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "7"},
        timeout=60).stdout.split()
    assert words.doubt.digests == tuple(int(d) for d in digests)


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
