"""The batcher's accumulation: per-key partial batches, emitted by size, age or flush.

Pure and synchronous (ARCHITECTURE §9) so Broadway's batching rules can be property-tested
without processes: every item comes out exactly once, in its key's arrival order, in a
batch no bigger than ``batch_size``; a partial batch waits at most ``batch_timeout`` from
its first item; a flush (the end of the stream in the drain, or the operator's pause)
emits everything at once.  The stage owns the clock and the
timer: it passes ``now`` in and arms a timer for :meth:`BatchAccumulator.next_deadline`.

Two ways to measure a batch: a count of items (Broadway's ``batch_size``), or, with
``size_of``, a budget in its units (e.g. encoded bytes, so a batch of large rows stays
under a frame or Spark write limit).  With a budget a batch is emitted as soon as the
next item would not fit, or when it is exactly full, and an item larger than the whole
budget forms a batch of its own rather than being stuck forever.

The hot path is one frame of events at a time, so the work is per key, not per item:
one grouping pass over the frame (a C-speed shortcut when the whole frame has one key,
the usual case), then slices; with a budget, sizes are summed by ``accumulate`` and the
cut points found by bisection.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Hashable
from itertools import accumulate
from operator import itemgetter
from typing import Generic, NamedTuple, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Batch(NamedTuple, Generic[K, V]):
    """One emitted batch.  A named record, so the batcher (which adds where it goes and its
    encoded frame, :class:`offbroadway.stages.roles.batcher.Outgoing`) and the tests read
    its fields by name, in one order."""

    key: K
    items: list[V]
    #: what emitted it: ``"size"``, ``"timeout"`` or ``"flush"``
    trigger: str


_first = itemgetter(0)
_second = itemgetter(1)


class _Partial(Generic[V]):
    __slots__ = ("first_at", "items", "size")

    def __init__(self, items: list[V], first_at: float, size: int) -> None:
        self.items = items
        self.first_at = first_at
        self.size = size          # in size_of units; unused when counting items


class BatchAccumulator(Generic[K, V]):
    """Partial batches per key; see the module docstring for the rules."""

    def __init__(self, batch_size: int, batch_timeout: float,
                 size_of: Callable[[V], int] | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size!r}")
        if batch_timeout < 0:
            raise ValueError(f"batch_timeout must not be negative, not {batch_timeout!r}")
        self.batch_size = batch_size
        self.batch_timeout = batch_timeout
        self.size_of = size_of
        # Insertion order is first-item order (a key is re-inserted whenever its partial
        # batch starts afresh, and the clock never goes back), so the oldest partial is
        # always first: next_deadline is O(1) and expire stops at the first young one.
        self._partial: dict[K, _Partial[V]] = {}
        self._count = 0
        self._clock = float("-inf")

    def __len__(self) -> int:
        """Items held in partial batches."""
        return self._count

    def _tick(self, now: float) -> float:
        # A clock that went back (it should be time.monotonic()) is held where it was, so
        # the first-item order above stays true and no batch waits past its deadline.
        if now < self._clock:
            return self._clock
        self._clock = now
        return now

    # -- adding -----------------------------------------------------------------------------
    def add_many(self, items: list[tuple[K, V]], now: float) -> list[Batch[K, V]]:
        """Add ``(key, item)`` pairs that arrived at ``now``; the batches they fill."""
        if not items:
            return []
        now = self._tick(now)
        out: list[Batch[K, V]] = []
        add = self._add_counted if self.size_of is None else self._add_sized
        for key, vals in _group(items).items():
            add(key, vals, now, out)
        return out

    def add_run(self, key: K, items: list[V], now: float) -> list[Batch[K, V]]:
        """Add ``items`` of one key that arrived at ``now`` (a frame's events share their
        batch key): :meth:`add_many` without the grouping pass."""
        if not items:
            return []
        now = self._tick(now)
        out: list[Batch[K, V]] = []
        if self.size_of is None:
            self._add_counted(key, items, now, out)
        else:
            self._add_sized(key, items, now, out)
        return out

    def _add_counted(self, key: K, vals: list[V], now: float, out: list[Batch[K, V]]) -> None:
        bs = self.batch_size
        n = len(vals)
        self._count += n
        start = 0
        part = self._partial.get(key)
        if part is not None:
            need = bs - len(part.items)
            if n < need:
                part.items.extend(vals)
                return
            batch = part.items
            batch.extend(vals[:need])
            del self._partial[key]
            self._count -= bs
            out.append(Batch(key, batch, "size"))
            start = need
        full_end = start + (n - start) // bs * bs
        if start == 0 and full_end == n == bs:
            out.append(Batch(key, vals, "size"))      # exactly one batch: no copy
        else:
            for i in range(start, full_end, bs):
                out.append(Batch(key, vals[i:i + bs], "size"))
        self._count -= full_end - start
        if full_end < n:
            self._partial[key] = _Partial(vals[full_end:], now, 0)

    def _add_sized(self, key: K, vals: list[V], now: float, out: list[Batch[K, V]]) -> None:
        budget = self.batch_size
        size_of = self.size_of
        assert size_of is not None
        sizes = list(map(size_of, vals))
        if min(sizes) < 0:
            raise ValueError("size_of returned a negative size")
        pre = [0, *accumulate(sizes)]       # pre[j] = size of vals[:j]
        n = len(vals)
        self._count += n
        part = self._partial.get(key)
        live = part is not None             # the old partial is still in the table
        cur: list[V] | None = part.items if part is not None else None
        base = part.size if part is not None else 0
        start = 0
        while start < n:
            # the longest run vals[start:end] that still fits in what is left of the budget
            end = bisect_right(pre, pre[start] + budget - base, start) - 1
            if end == start:                        # the next item does not fit
                if cur:
                    self._emit_sized(key, cur, live, out)
                    cur, base, live = None, 0, False
                else:                               # larger than the whole budget
                    self._emit_sized(key, [vals[start]], False, out)
                    start += 1
                continue
            if cur is None:
                cur = vals[start:end]
            else:
                cur.extend(vals[start:end])
            base += pre[end] - pre[start]
            start = end
            if start < n or base >= budget:         # the next would not fit, or it is full
                self._emit_sized(key, cur, live, out)
                cur, base, live = None, 0, False
        if live:
            assert part is not None
            part.size = base                        # its items were extended in place
        elif cur:
            self._partial[key] = _Partial(cur, now, base)

    def _emit_sized(self, key: K, batch: list[V], live: bool,
                    out: list[Batch[K, V]]) -> None:
        if live:
            del self._partial[key]
        self._count -= len(batch)
        out.append(Batch(key, batch, "size"))

    def resize(self, batch_size: int, batch_timeout: float) -> list[Batch[K, V]]:
        """New limits (a reload): batches from now on use them.  Partial batches already at
        the new size are emitted at once (in full batches of it; a remainder stays partial
        with its first item's time), so no batch is ever bigger than ``batch_size`` was
        when it was emitted."""
        if batch_size < 1 or batch_timeout < 0:
            raise ValueError(f"bad batch limits {batch_size!r}, {batch_timeout!r}")
        self.batch_size, self.batch_timeout = batch_size, batch_timeout
        out: list[Batch[K, V]] = []
        for key in list(self._partial):
            part = self._partial[key]
            if self.size_of is not None:
                if part.size >= batch_size:
                    self._emit_sized(key, part.items, True, out)
                continue
            items = part.items
            full = len(items) // batch_size * batch_size
            if not full:
                continue
            out.extend(Batch(key, items[i:i + batch_size], "size")
                       for i in range(0, full, batch_size))
            self._count -= full
            if full < len(items):
                part.items = items[full:]
            else:
                del self._partial[key]
        return out

    # -- timing out and flushing ------------------------------------------------------------
    def next_deadline(self) -> float | None:
        """When the oldest partial batch times out (None: nothing is waiting)."""
        for part in self._partial.values():
            return part.first_at + self.batch_timeout
        return None

    def expire(self, now: float) -> list[Batch[K, V]]:
        """Emit the partial batches whose first item is ``batch_timeout`` old at ``now``."""
        now = self._tick(now)
        timeout = self.batch_timeout
        due: list[K] = []
        for key, part in self._partial.items():
            if part.first_at + timeout > now:
                break
            due.append(key)
        return self._take(due, "timeout")

    def flush(self) -> list[Batch[K, V]]:
        """Emit every partial batch now (the end of the stream in the drain, or the
        operator's pause: nothing waits for its timeout)."""
        return self._take(list(self._partial), "flush")

    def _take(self, keys: list[K], trigger: str) -> list[Batch[K, V]]:
        out: list[Batch[K, V]] = []
        pop = self._partial.pop
        for key in keys:
            items = pop(key).items
            self._count -= len(items)
            out.append(Batch(key, items, trigger))
        return out


def _group(items: list[tuple[K, V]]) -> dict[K, list[V]]:
    """Items per key, keys in first-appearance order, items in arrival order."""
    keys = list(map(_first, items))
    first = keys[0]
    if keys.count(first) == len(keys):       # one key for the whole frame: C speed
        return {first: list(map(_second, items))}
    groups: dict[K, list[V]] = {}
    for key, item in items:
        g = groups.get(key)
        if g is None:
            groups[key] = [item]
        else:
            g.append(item)
    return groups
