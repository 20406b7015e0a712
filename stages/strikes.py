"""Crashes blamed on each message, so a poison message is failed instead of redelivered.

Pure and synchronous (ARCHITECTURE §9): the producer feeds it the daemon's blame for each
processor that died unexpectedly and asks it, when a message comes back from the source,
whether that message has killed a processor often enough to be failed.  Keyed by message
id, because that is what survives a redelivery (a token is per delivery).

Memory is bounded twice: an id is forgotten as soon as its message settles (acked or
failed), and past ``cap`` ids the oldest are dropped, so ids whose messages never come
back (expired at the broker, taken by another consumer) cannot grow the table.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

DEFAULT_CAP = 10_000


@dataclass
class Record:
    crashes: int
    child: str
    how: str


class StrikeTable:
    """message id → crashes blamed on it; ``limit`` crashes make a message poison.

    ``limit`` 0 turns the table off: nothing is recorded and nothing is ever poison.
    """

    def __init__(self, limit: int = 3, cap: int = DEFAULT_CAP) -> None:
        if limit < 0 or cap < 1:
            raise ValueError(f"limit must be >= 0 and cap >= 1 (got {limit}, {cap})")
        self.limit = limit
        self.cap = cap
        self._table: OrderedDict[str, Record] = OrderedDict()
        #: ids dropped because the table was full (an operator sees it in status)
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._table)

    def __bool__(self) -> bool:
        return bool(self._table)

    def __contains__(self, msg_id: object) -> bool:
        try:
            return msg_id in self._table
        except TypeError:
            return False

    def crashes(self, msg_id: str) -> int:
        rec = self._table.get(msg_id)
        return rec.crashes if rec is not None else 0

    def strike(self, msg_id: str, child: str, how: str) -> int:
        """One more crash blamed on ``msg_id`` (of ``child``, ended ``how``): the count."""
        if not self.limit:
            return 0
        rec = self._table.get(msg_id)
        if rec is None:
            rec = self._table[msg_id] = Record(0, child, how)
            while len(self._table) > self.cap:
                self._table.popitem(last=False)
                self.evicted += 1
        else:
            self._table.move_to_end(msg_id)
        rec.crashes += 1
        rec.child, rec.how = child, how
        return rec.crashes

    def verdict(self, msg_id: str) -> str | None:
        """The failure reason if ``msg_id`` is poison (``limit`` crashes or more), else None."""
        rec = self._table.get(msg_id)
        if rec is None or not self.limit or rec.crashes < self.limit:
            return None
        times = "once" if rec.crashes == 1 else f"{rec.crashes} times"
        return f"poison message: killed a processor {times} (last: {rec.child} {rec.how})"

    def forget(self, msg_id: str) -> None:
        """The message settled: its crashes no longer matter."""
        self._table.pop(msg_id, None)
