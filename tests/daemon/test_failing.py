"""The pipeline's failure books from the producers' notes (daemon/core/failing.py): each
failed message in circulation counted once, by the producer it failed on last, whatever
order the notes arrive in; and what each producer is told to change in its own books."""

from __future__ import annotations

from offbroadway.daemon.core.failing import SETTLED_WINDOW, FailingLedger
from offbroadway.stages.wire.commands import NOTE_FAILED, NOTE_SETTLED, Reconcile

P = ["producer_0", "producer_1", "producer_2"]


def told(sends) -> dict[str, tuple[list, list]]:
    assert all(isinstance(s.command, Reconcile) for s in sends)
    return {s.stage: (s.command.settled, s.command.moved) for s in sends}


def test_a_failure_settled_on_a_sibling_leaves_every_producer_s_books() -> None:
    books = FailingLedger()
    assert told(books.take("producer_0", [[NOTE_FAILED, 7, 1.0]], P)) == {}
    assert books.count() == 1 and books.count(["producer_0"]) == 1
    sends = told(books.take("producer_1", [[NOTE_SETTLED, 7, 2.0]], P))
    assert books.count() == 0
    # the one that failed it and any other that knows it drop it; the settler knows
    assert sends == {"producer_0": ([[7, 2.0]], []), "producer_2": ([[7, 2.0]], [])}


def test_a_settlement_noted_before_its_failure_still_ends_it() -> None:
    """producer_1 reports first, though its ack came after producer_0's failure."""
    books = FailingLedger()
    assert told(books.take("producer_1", [[NOTE_SETTLED, 7, 2.0]], P)) == {}
    sends = told(books.take("producer_0", [[NOTE_FAILED, 7, 1.0]], P))
    assert books.count() == 0
    assert sends == {"producer_0": ([[7, 2.0]], [])}


def test_a_message_failing_on_two_producers_is_counted_once_by_the_last() -> None:
    books = FailingLedger()
    books.take("producer_0", [[NOTE_FAILED, 7, 1.0]], P)
    sends = told(books.take("producer_1", [[NOTE_FAILED, 7, 2.0]], P))
    assert sends == {"producer_0": ([], [[7, 2.0]])}
    assert (books.count(), books.count(["producer_0"]), books.count(["producer_1"])) == \
        (1, 0, 1)
    # producer_0's late word of an older failure changes nothing but its own books
    sends = told(books.take("producer_0", [[NOTE_FAILED, 7, 1.5]], P))
    assert sends == {"producer_0": ([], [[7, 2.0]])}
    assert books.count(["producer_1"]) == 1


def test_a_settlement_older_than_the_last_failure_leaves_it_failing() -> None:
    books = FailingLedger()
    books.take("producer_0", [[NOTE_FAILED, 7, 3.0]], P)
    assert told(books.take("producer_1", [[NOTE_SETTLED, 7, 2.0]], P)) == {}
    assert books.count() == 1


def test_settlements_are_remembered_for_a_while_only() -> None:
    books = FailingLedger()
    books.take("producer_1", [[NOTE_SETTLED, 7, 1.0]], P)
    books.take("producer_1", [[NOTE_SETTLED, 8, 1.0 + 2 * SETTLED_WINDOW]], P)
    books.take("producer_0", [[NOTE_FAILED, 7, 0.5]], P)     # too late to be matched
    assert books.count() == 1


def test_notes_that_do_not_check_are_skipped() -> None:
    books = FailingLedger()
    assert books.take("producer_0", "junk", P) == []
    books.take("producer_0", [["x"], [NOTE_FAILED, "7", 1.0], [NOTE_FAILED, 9, "soon"],
                              [NOTE_FAILED, 7, 1.0]], P)
    assert books.count() == 1


def test_acks_in_doubt_that_come_back_leave_the_doubt_and_the_rest_land() -> None:
    """A producer killed while an ack frame of four messages (7, 8, 9 and 9: two equal
    bodies) was leaving: 8 and one 9 come back (noted after the frame: the broker never
    got it... for those); a note of 7 from before the frame (its own settlement, in the
    notes file the daemon read first) is no return.  At the run's end the rest landed."""
    books = FailingLedger()
    books.take("producer_0", [[NOTE_SETTLED, 7, 4.0]], P)     # before the frame
    books.doubt("producer_0", 5.0, [7, 8, 9, 9])
    assert books.doubts() == 4 and books.doubts(["producer_1"]) == 0
    books.take("producer_1", [[NOTE_SETTLED, 8, 6.0], [NOTE_FAILED, 9, 6.5]], P)
    assert books.doubts(["producer_0"]) == 2
    assert books.land_doubts() == {"producer_0": 2}
    assert books.doubts() == 0 and books.land_doubts() == {}


def test_a_return_heard_before_the_doubt_is_no_doubt() -> None:
    """producer_1 settled a message of the frame (it came back) and reported before the
    daemon read the dead producer's tally."""
    books = FailingLedger()
    books.take("producer_1", [[NOTE_SETTLED, 8, 6.0]], P)
    books.doubt("producer_0", 5.0, [7, 8])
    assert books.land_doubts() == {"producer_0": 1}


def test_landed_acks_are_credited_to_the_producer_s_totals() -> None:
    from offbroadway.daemon.core.totals import StageTotals

    totals = StageTotals()
    totals.report("producer_0", {"pid": 1, "acked": 10})
    totals.report("producer_0", {"pid": 2, "acked": 3})
    totals.credit("producer_0", "acked", 4)
    assert totals.total("producer_0", "acked") == 17
