"""The producer's in-flight table: every message emitted and not yet settled.

This is what "nothing lost" rests on (ARCHITECTURE §5): a message leaves the table only
when an ack settles it (the source then acks or fails it) or when a stage downstream dies
and everything in flight is handed back to the source to requeue.  Pure and synchronous
so conservation can be property-tested: each handle added comes out exactly once.

Acks come over the wire from other processes, so they are untrusted input: a token that
is not in the table (an ack for a previous incarnation's message, a duplicate, one that
arrived after a requeue, or garbage) is counted in :attr:`InFlightTable.unknown` and
ignored.  It must never crash the producer nor settle someone else's message; tokens are
unique per incarnation (they start at its start time in ns) so that cannot happen.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import count, repeat
from typing import Any, Generic, TypeVar

H = TypeVar("H")

_MISSING: Any = object()


class InFlightTable(Generic[H]):
    """token → source handle, in emission order."""

    def __init__(self) -> None:
        self._table: dict[int, H] = {}
        #: every token :meth:`add_range` may take is at least this (one above the last)
        self._floor = 0
        #: acks (ok or failed) naming a token that is not in flight, since creation
        self.unknown = 0

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, token: object) -> bool:
        try:
            return token in self._table
        except TypeError:
            return False

    def add_many(self, entries: Iterable[tuple[int, H]]) -> None:
        """Record emitted messages.

        A token already in flight would silently replace (and so lose) a handle, which is
        a producer bug: :class:`ValueError`, and the table is left unchanged.
        """
        if not isinstance(entries, list):
            entries = list(entries)
        new = dict(entries)
        table = self._table
        if len(new) != len(entries) or not table.keys().isdisjoint(new):
            raise ValueError("a token is already in flight or repeated in this add_many")
        table.update(new)
        ints = [t for t in new if type(t) is int]
        if ints:
            self._floor = max(self._floor, max(ints) + 1)

    def add_range(self, first: int, handles: Iterable[H]) -> int:
        """Record emitted messages whose tokens run from ``first`` up (the producer's
        fresh tokens, the hot path: one C-speed ``update``).  Tokens only ever grow, so a
        ``first`` above every token added so far cannot repeat one; anything else is a
        producer bug (:class:`ValueError`, table unchanged).  The number added."""
        if first < self._floor:
            raise ValueError(f"token {first} is not above the last added ({self._floor - 1})")
        table = self._table
        before = len(table)
        table.update(zip(count(first), handles))
        n = len(table) - before
        self._floor = first + n
        return n

    def settle(self, ok_tokens: Iterable[Any], failed: Iterable[Any]
               ) -> tuple[list[H], list[tuple[H, str]]]:
        """Remove acked messages: (handles to ack, (handle, reason) to fail).

        A token named twice (in one call or across calls) settles once; the repeats are
        unknown.  A failed entry that is not a ``(token, reason)`` pair is unknown too.
        """
        pop = self._table.pop
        handles: list[H] = []
        unknown = 0
        if not isinstance(ok_tokens, list):
            ok_tokens = list(ok_tokens)
        if ok_tokens and set(map(type, ok_tokens)) == {int}:
            # the usual case, all plain tokens: popped at C speed, one pass
            got = list(map(pop, ok_tokens, repeat(_MISSING, len(ok_tokens))))
            unknown = got.count(_MISSING)
            handles = [h for h in got if h is not _MISSING] if unknown else got
            ok_tokens = ()
        for t in ok_tokens:
            try:
                h = pop(t, _MISSING)
            except TypeError:            # an unhashable token off the wire
                h = _MISSING
            if h is _MISSING:
                unknown += 1
            else:
                handles.append(h)
        failures: list[tuple[H, str]] = []
        for entry in failed:
            try:
                t, reason = entry
                h = pop(t, _MISSING)
            except (TypeError, ValueError):
                h = _MISSING
            if h is _MISSING:
                unknown += 1
            else:
                failures.append((h, reason if isinstance(reason, str) else str(reason)))
        self.unknown += unknown
        return handles, failures

    def take_all(self) -> list[H]:
        """Empty the table and return every handle, oldest first, to be requeued: a stage
        downstream died and whatever it held is lost; acks that arrive later for these
        tokens are unknown (the source already has the messages back)."""
        handles = list(self._table.values())
        self._table.clear()
        return handles
