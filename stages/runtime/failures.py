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


class FailureTally:
    def __init__(self, interval: float = INTERVAL) -> None:
        self.interval = interval
        self.counts: Counter[str] = Counter()
        self.pending = 0
        self.total = 0
        self._last_line_at = float("-inf")

    def add(self, reasons: Iterable[str]) -> None:
        """Count one group of failed messages (their ``status`` strings)."""
        n = 0
        for reason in reasons:
            n += 1
            key = (reason or "failed")[:REASON_CHARS]
            if key in self.counts or len(self.counts) < KEPT:
                self.counts[key] += 1
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
        shown = "; ".join(f"{n} x {reason}" for reason, n in top)
        more = len(self.counts) - len(top)
        text = (f"{stage}: {self.pending} messages failed{' ' + since if since else ''} "
                f"({self.total} in all): {shown}"
                + (f"; and {more} more reasons" if more > 0 else ""))
        self.counts.clear()
        self.pending = 0
        self._last_line_at = now
        return text
