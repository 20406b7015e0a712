"""The "wrote N rows" line counts what is in the dataset: rows the committer answered
without writing them (their message was there already, or came twice in one group) are
acked by the batch processors but are not rows of this run."""

from offbroadway.daemon.core.outcome import Outcome, Written


def test_rows_acked_as_already_written_are_not_counted_twice() -> None:
    # an operator restart: stale copies and their redeliveries were acked (873 twice),
    # the committer wrote each message once
    w = Written("default", committed=12_000, acked=12_873, already=873)
    assert (w.rows, w.unanswered) == (12_000, 0)


def test_commits_whose_batch_processor_stopped_are_said() -> None:
    # 500 rows committed after their batch processor stopped; redelivered, they were
    # acked as already written
    w = Written("default", committed=12_000, acked=12_000, already=500)
    assert (w.rows, w.unanswered) == (12_000, 500)
    line = Outcome("orders", acked=12_000, failed=0, unacked=0, written=[w],
                   output="/data", fmt="parquet").lines()[0]
    assert line.startswith("orders: wrote 12000 rows to /data/default (parquet); 500 of them")


def test_a_committer_report_trailing_the_acks_never_lowers_the_count() -> None:
    w = Written("default", committed=9_000, acked=10_000, already=0)
    assert w.rows == 10_000
