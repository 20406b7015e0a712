"""Failed messages, counted per reason between two WARNING lines: failures are loud, not
one log call per message.

A stage that finishes messages (its acker) adds the reasons of each failed group; the
stage's tick asks :meth:`FailureTally.line` for at most one line per ``interval``, which
says how many failed and why, the most frequent reasons first.  Pure: no logging, no
clock of its own, so the arithmetic is tested without a process.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

#: seconds between two lines of one stage while messages keep failing
INTERVAL = 10.0
#: reasons shown in one line; the rest are counted as "N more reasons"
SHOWN = 3
#: distinct reasons remembered between two lines (a reason with a message id in it must
#: not grow the table without bound)
KEPT = 100
REASON_CHARS = 200


def _ids_or_none(ids: Iterable[object]):
    """The ids, then None for ever (a group given without ids)."""
    yield from ids
    while True:
        yield None


class FailureTally:
    def __init__(self, interval: float = INTERVAL) -> None:
        self.interval = interval
        self.counts: Counter[str] = Counter()
        #: reason -> the id of the first message that failed for it since the last line
        self.first: dict[str, str] = {}
        self.pending = 0
        self.total = 0
        self._last_line_at = float("-inf")

    def add(self, reasons: Iterable[str], ids: Iterable[object] = ()) -> None:
        """Count one group of failed messages (their ``status`` strings and, if given,
        their ids: the line names the first message of each reason)."""
        n = 0
        first = self.first
        for reason, msg_id in zip(reasons, _ids_or_none(ids)):
            n += 1
            key = (reason or "failed")[:REASON_CHARS]
            if key in self.counts or len(self.counts) < KEPT:
                self.counts[key] += 1
                if msg_id is not None and key not in first:
                    first[key] = str(msg_id)[:REASON_CHARS]
            else:
                self.counts["(other reasons)"] += 1
        self.pending += n
        self.total += n

    def line(self, now: float, stage: str) -> str | None:
        """The WARNING text if messages failed and the last line is ``interval`` old."""
        if not self.pending or now - self._last_line_at < self.interval:
            return None
        since = ("since the last report" if self._last_line_at != float("-inf") else "")
        top = self.counts.most_common(SHOWN)
        shown = "; ".join(f"{n} x {reason}" + (f" (first: {self.first[reason]})"
                                                  if reason in self.first else "")
                          for reason, n in top)
        more = len(self.counts) - len(top)
        text = (f"{stage}: {self.pending} messages failed{' ' + since if since else ''} "
                f"({self.total} in all): {shown}"
                + (f"; and {more} more reasons" if more > 0 else ""))
        self.counts.clear()
        self.first.clear()
        self.pending = 0
        self._last_line_at = now
        return text
