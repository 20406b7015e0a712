"""What a run ended with: the lines an operator reads, and the exit code that says the same.

The end of a run is read by people (the README's main job prints where the dataset is and
how many rows it wrote) and by scripts (``--until-idle`` in a cron job or CI).  Both must
get the truth, so both come from one place and from the books themselves:

* **rows written** are the rows the committers committed to Spark (each committer is the
  only writer of its dataset and counts a batch when its job committed), not the rows the
  batch processors acked: a batch processor stopped while its commit was under way (a
  restart, a stop) never hears the answer, yet the rows are in the dataset, and its
  messages are written again when the source redelivers them;
* **acked, failed, unacked** are the sources' own figures, as their producers last
  reported them: ``unacked`` is what a source still owes (delivered, never settled), so a
  run that ends with it above zero did not do what ``--until-idle`` promises.  ``failed``
  counts messages, once each however often they were delivered; the failed deliveries
  and the requeues among them are counted apart and named so (a requeuing policy sends a
  message that fails on every delivery round many times).  ``stay`` are failed messages
  the policy sent back to the queue, where they are now: the broker holds them, so the
  run says so and never "every message settled".  A source without per-message books
  (its ``failure_requeued``, NATS's ``naked``) has its requeued failures left out of the
  exit code, as before.

Exit codes of ``run --until-idle`` (docs/operations.md): 0 every message written and
acked, 3 the run finished but some messages failed (they went to the source's failure
policy, or stay in the queue when it requeues them), 1 messages are left unacked at the
source (a drain past ``shutdown_timeout``, a source that still owes), or the pipeline gave
up.  Pure: the daemon hands in the figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: every message written (or handled) and acked
EXIT_OK = 0
#: messages left unacked at the source, or the pipeline could not run
EXIT_UNACKED = 1
#: the run finished, but some messages failed (handle_failed, then the failure policy)
EXIT_FAILED = 3


@dataclass(frozen=True)
class Written:
    """One Spark batcher's rows: committed to the dataset, acked by batch processors, and
    of those acked, the rows the committer answered without writing them (``already``:
    their message was in the dataset already, or came twice in one group; see
    stages/spark/spark_once.py)."""

    key: str
    committed: int
    acked: int
    already: int = 0

    @property
    def rows(self) -> int:
        """Rows in the dataset from this run.  Every acked row was committed first or is
        counted in ``already``; a committer's report can trail its batch processors' by
        a tick, never the truth."""
        return max(self.committed, self.acked - self.already)

    @property
    def unanswered(self) -> int:
        """Rows committed whose batch processor never acked them (it stopped before the
        committer's answer): their messages went back to the source, and came back to be
        acked without being written again."""
        return max(0, self.committed - (self.acked - self.already))


@dataclass(frozen=True)
class Outcome:
    pipeline: str
    acked: int
    failed: int
    unacked: int
    #: where failed messages went (the sources' failure places), "" if unknown
    failed_to: str = ""
    #: failures the source's policy handed back for another delivery (RabbitMQ's
    #: ``reject_and_requeue``, a NATS ``nak``): not the end of those messages
    failures_retried: int = 0
    #: failed deliveries (``failed`` counts messages), and those the policy requeued
    failed_deliveries: int = 0
    requeued_failures: int = 0
    #: failed messages back in the queue (a requeuing policy), and where: "queue 'q': …"
    stay: int = 0
    stay_in: str = ""
    written: list[Written] = field(default_factory=list)
    #: with [spark]: the output and its format, for the "wrote" lines
    output: str = ""
    fmt: str = ""
    #: with [spark] table: the table's name ("{batcher}" stands for the key)
    table: str = ""

    def lines(self) -> list[str]:
        """The run's last lines, on stdout."""
        out = []
        for w in self.written:
            where = f"table {self.table.replace('{batcher}', w.key)}" if self.table \
                else f"{self.output}/{w.key}"
            line = f"{self.pipeline}: wrote {w.rows} rows to {where} ({self.fmt})"
            if w.unanswered:
                line += (f"; {w.unanswered} of them were committed after their batch processor "
                         "stopped waiting, so their messages were not acked by that write "
                         "(when redelivered they are acked, not written again)")
            out.append(line)
        line = f"{self.pipeline}: {self.acked} messages acked, {self.failed} failed"
        if self.failed and self.failed_to:
            line += f" (failed messages: {self.failed_to})"
        if self.failed_deliveries > self.failed or self.requeued_failures:
            line += (f"; {self.failed_deliveries} deliveries failed, "
                     f"{self.requeued_failures} of them requeued for another try")
        if self.unacked:
            line += f", {self.unacked} left unacked at the source (delivered again next run)"
        out.append(line)
        return out

    def until_idle_exit(self) -> tuple[int, str]:
        """``--until-idle``'s exit code for a drain that ended, and the line that says why
        (empty for 0)."""
        if self.unacked:
            return EXIT_UNACKED, (f"--until-idle: {self.unacked} message(s) left unacked at "
                                  "the source (they are delivered again at the next run); "
                                  f"exiting {EXIT_UNACKED}")
        if self.stay:
            others = self.failed - self.stay
            return EXIT_FAILED, (
                f"--until-idle: {self.stay} message(s) stay in {self.stay_in or 'the queue'}"
                + (f"; {others} other(s) failed for good (failed messages: "
                   f"{self.failed_to})" if others > 0 else "")
                + f"; exiting {EXIT_FAILED}")
        final = self.failed - self.failures_retried
        if final > 0:
            where = f" (failed messages: {self.failed_to})" if self.failed_to else ""
            if self.failures_retried:
                # handed back for another delivery: the source still holds those
                return EXIT_FAILED, (
                    f"--until-idle: {final} message(s) failed{where}; "
                    f"{self.failures_retried} failed deliveries were handed back to the "
                    f"source for another try; exiting {EXIT_FAILED}")
            return EXIT_FAILED, (f"--until-idle: every message settled, {final} of them "
                                 f"failed{where}; exiting {EXIT_FAILED}")
        return EXIT_OK, ""
