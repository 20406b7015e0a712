"""Group commit: which handed-over batches go into the next Spark job, and when.

The pure core of the committer (:mod:`.committer`): no Spark, no sockets, no clock of its
own (callers pass ``now``).  Why group at all: a Spark write costs ~100-270 ms whatever
its size (docs/design-spark.md §7), so one job per 2,000-row Broadway batch spends most
of its time in that fixed cost, and one job per 200,000 rows does not.

The rule, the one databases use for group commit:

* one job at a time per dataset (the committer never starts a second while one runs);
* when none runs, the next starts as soon as ``rows`` rows are waiting, or the oldest
  waiting batch has waited ``interval`` seconds, or a waiting batch was flushed (trigger
  ``flush``) or comes from a batch processor that said nothing more follows (``DRAINED``):
  the pipeline is draining, nobody should wait for more;
* a job takes every waiting batch, up to ``max_rows`` (at least one batch).

So under light load a batch waits at most ``interval``; under heavy load the batches that
gathered while a job ran go together into the next, and the group grows with Spark's own
latency: the slower Spark is, the larger (and cheaper per row) each job.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..runtime.spec import DEFAULT_INTERVAL, DEFAULT_ROWS


@dataclass
class Handed:
    """One Broadway batch handed to the committer, waiting for (or in) a Spark job."""

    peer: bytes          # the batch processor's routing id
    ref: int             # its reference for the batch (echoed in the result)
    rows: int
    trigger: str         # the BatchInfo trigger ("size", "timeout", "flush")
    at: float            # when it arrived (monotonic)
    file: str = ""       # the staged Parquet file's name (in the batcher's staging dir)
    schema: bytes = field(default=b"", repr=False)   # its Arrow schema, IPC bytes


@dataclass(frozen=True)
class Answer:
    """The committer's answer to one batch: written (``error`` None) or failed."""

    peer: bytes
    ref: int
    error: str | None


@dataclass(frozen=True)
class Finished:
    """What a finished commit means for the stage: the rows it wrote (its batches that did
    not fail, less the rows left out of them) and one answer per batch."""

    rows: int
    answers: list[Answer]


class CommitGroups:
    """Batches waiting for a Spark job, and the decision to start one."""

    def __init__(self, rows: int = DEFAULT_ROWS, interval: float = DEFAULT_INTERVAL,
                 max_rows: int | None = None) -> None:
        if rows <= 0 or interval < 0:
            raise ValueError("rows must be > 0 and interval >= 0")
        self.rows = rows
        self.interval = interval
        self.max_rows = max_rows or 4 * rows
        self.waiting: deque[Handed] = deque()
        self.waiting_rows = 0
        self._flushes = 0
        #: batch processors that said nothing more follows (until they hand over again)
        self.drained: set[bytes] = set()

    def __len__(self) -> int:
        return len(self.waiting)

    def add(self, item: Handed) -> None:
        self.drained.discard(item.peer)   # it hands over again (a run-again pass)
        self.waiting.append(item)
        self.waiting_rows += item.rows
        if item.trigger == "flush":
            self._flushes += 1

    def due_at(self) -> float | None:
        """When the oldest waiting batch has waited ``interval`` (None: nothing waits)."""
        return self.waiting[0].at + self.interval if self.waiting else None

    def ready(self, now: float) -> bool:
        """Whether a job should start now (the caller knows that none is running)."""
        if not self.waiting:
            return False
        return (self.waiting_rows >= self.rows or self._flushes > 0
                or now >= self.waiting[0].at + self.interval
                or (bool(self.drained) and any(h.peer in self.drained for h in self.waiting)))

    def drain(self, peer: bytes) -> None:
        """``peer`` hands over nothing more (``DRAINED``): its waiting batches are due now
        (a drain whose last batch was full has no ``flush`` batch to say so)."""
        self.drained.add(peer)

    def take(self) -> list[Handed]:
        """The next job's batches: oldest first, up to ``max_rows`` (at least one)."""
        out: list[Handed] = []
        total = 0
        while self.waiting and (not out or total + self.waiting[0].rows <= self.max_rows):
            item = self.waiting.popleft()
            out.append(item)
            total += item.rows
        self._forget(out)
        return out

    def drop_peer(self, peer: bytes) -> list[Handed]:
        """Forget a batch processor's waiting batches (it restarted: they are redelivered
        to its new incarnation anyway, so committing them would only make duplicates)."""
        self.drained.discard(peer)
        gone = [h for h in self.waiting if h.peer == peer]
        if gone:
            self.waiting = deque(h for h in self.waiting if h.peer != peer)
            self._forget(gone)
        return gone

    def _forget(self, items: Iterable[Handed]) -> None:
        for item in items:
            self.waiting_rows -= item.rows
            if item.trigger == "flush":
                self._flushes -= 1
