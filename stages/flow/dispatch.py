"""Dispatchers: which subscribed consumer gets which of a producer's events.

Pure and synchronous on purpose (ARCHITECTURE §9): the stage loops own the sockets and
call these per incoming frame, so every rule about demand can be tested without a process.
A consumer is known by its ZeroMQ routing id (``bytes``).  Demand is GenStage's: a
consumer subscribes with a ``max_demand``, asks for ``n`` more at a time, and a dispatcher
never hands a consumer more than it has asked for and not yet received.  A consumer may
also *retract* unmet demand (``retract(consumer, n)`` takes back up to ``n`` and says how
much), which is how a processor's one budget moves between producers (:mod:`.demand`).
Each dispatcher names its ``policy`` ("spread", "demand", "partition"), which the ROUTER
side tells every new subscriber.

``dispatch(items)`` returns ``(deliveries, leftovers)``.  Each delivery is
``(consumer, items)`` with *all* of that call's items for that consumer in one list,
because each delivery becomes one ZeroMQ frame and the per-frame cost, not the per-event
cost, is the hot path.  Items are handed out as contiguous slices of the input (no
per-item appends) and every consumer's list keeps the input order.  ``leftovers`` are the
items nobody could take, in input order; the caller keeps them and passes them first next
time.  When nothing is delivered the input list itself may come back as the leftovers.

Three dispatchers:

* :class:`SpreadDispatcher` (the default): idle-first.  Broadway's DemandDispatcher gives
  a whole frame to the consumer with the biggest demand, and with equal demands always to
  the same first subscriber, so under light load one processor does all the work while
  the others idle (seeds 003/004).  This one levels load instead.
* :class:`GenStageDemandDispatcher`: GenStage's behaviour, kept for comparison
  (``dispatcher = "demand"``) so the difference can be measured, not asserted.
* :class:`PartitionDispatcher`: an item goes only to the consumer(s) of its partition
  (``partition_by``, and one partition per batcher key).
"""

from __future__ import annotations

import zlib
from bisect import insort
from collections.abc import Callable, Hashable, Iterable, Sequence
from math import lcm
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

#: ``(deliveries, leftovers)`` as returned by ``dispatch``.
Dispatched = tuple[list[tuple[bytes, list[T]]], list[T]]


class Dispatcher(Protocol):
    """What the producer, processor and batcher stages rely on."""

    def subscribe(self, consumer: bytes, max_demand: int, partition: Any = None) -> None: ...

    #: told to each consumer in SUBSCRIBED: "spread", "demand" or "partition"
    policy: str

    def ask(self, consumer: bytes, n: int) -> None: ...

    def retract(self, consumer: bytes, n: int) -> int: ...

    def cancel(self, consumer: bytes) -> None: ...

    def dispatch(self, items: list[T]) -> Dispatched[T]: ...

    def consumers(self) -> list[bytes]: ...

    @property
    def demand(self) -> int: ...


def stable_hash(key: Any) -> int:
    """A partition key's hash, the same in every process (``hash(str)`` is salted per
    process): an int is itself, anything else the CRC-32 of its ``repr``.  Producers and
    batchers route with it, so a key lands on the same partition whoever computes it."""
    if isinstance(key, int):
        return key
    return zlib.crc32(repr(key).encode())


def _check_max_demand(max_demand: int) -> None:
    if max_demand < 1:
        raise ValueError(f"max_demand must be at least 1, not {max_demand!r}")


def _check_ask(n: int) -> None:
    if n < 0:
        raise ValueError(f"cannot ask for {n!r} events")


def _check_retract(n: int) -> None:
    if n < 0:
        raise ValueError(f"cannot retract {n!r} events")


# -- idle-first ---------------------------------------------------------------------------------

class SpreadDispatcher:
    """Idle-first dispatch: each next event goes to the least loaded consumer.

    *Load* is what a producer can see of it: the share of its ``max_demand`` a consumer
    has been sent and not yet asked for again, i.e. ``1 - remaining / max_demand``.  The
    result is water-filling: events go to the consumers with the most remaining demand
    relative to ``max_demand`` until they are level with the next ones, then round the
    level set, one event each, before anyone at that level gets a second.  So with equal
    state, K events for C ≥ K consumers go to K different consumers; an idle consumer is
    served before a busy one; and under heavy load (at least as many events as demand)
    everyone simply gets all it asked for.

    Ties are broken by a rotation over the consumers sorted by routing id.  Sorting, not
    subscription order, makes every producer agree on the order whatever order the
    subscriptions arrived in, so ``offset`` (the producer index) really does make several
    producers pick *different* consumers first when they all see the same state -- the
    failure GenStage's shuffle only blurred (seed 003).  After each dispatch the rotation
    moves past the last tied consumer served, so among equals the least recently served
    goes first (GenStage's FIFO among ties, with the phase set by ``offset``).

    The allocation is computed per consumer, not per event: a binary search finds the
    level down to which demand is filled, so a 1000-event call with C consumers costs
    O(C log max_demand) integer arithmetic plus C slices, whatever the number of events.
    """

    policy = "spread"

    def __init__(self, offset: int = 0) -> None:
        self._order: list[bytes] = []            # consumers sorted by routing id
        self._demand: dict[bytes, int] = {}      # outstanding demand per consumer
        self._max: dict[bytes, int] = {}
        self._weight: dict[bytes, int] = {}      # lcm(max_demands) // max_demand
        self._total = 0
        self._cursor = offset                    # rotation start (mod len(_order))

    # -- subscriptions ---------------------------------------------------------------------
    def subscribe(self, consumer: bytes, max_demand: int, partition: Any = None) -> None:
        """Add ``consumer`` with no demand yet.  ``partition`` is ignored.

        A consumer that subscribes again (a restarted stage keeps its routing id) starts
        afresh: whatever it had asked for before died with its previous incarnation.
        """
        _check_max_demand(max_demand)
        if consumer in self._demand:
            self.cancel(consumer)
        insort(self._order, consumer)
        self._demand[consumer] = 0
        self._max[consumer] = max_demand
        self._reweigh()

    def ask(self, consumer: bytes, n: int) -> None:
        """Add ``n`` to the consumer's demand; :class:`KeyError` if it is not subscribed."""
        _check_ask(n)
        self._demand[consumer] += n
        self._total += n

    def retract(self, consumer: bytes, n: int) -> int:
        """Take back up to ``n`` of the consumer's unmet demand; how much was taken.

        :class:`KeyError` if it is not subscribed.  The caller answers RETRACTED with the
        result *after* every event already sent to that consumer, which is what makes the
        consumer's accounting exact (:mod:`.demand`).
        """
        _check_retract(n)
        k = min(n, self._demand[consumer])
        self._demand[consumer] -= k
        self._total -= k
        return k

    def cancel(self, consumer: bytes) -> None:
        """Forget the consumer and its demand (unknown consumers are ignored)."""
        d = self._demand.pop(consumer, None)
        if d is None:
            return
        self._total -= d
        del self._max[consumer]
        self._order.remove(consumer)
        self._reweigh()

    def _reweigh(self) -> None:
        # Integer weights make "remaining / max_demand" comparable without floats:
        # remaining * (L // max) orders consumers exactly as the ratios do.
        big = lcm(*self._max.values()) if self._max else 1
        self._weight = {c: big // m for c, m in self._max.items()}

    def consumers(self) -> list[bytes]:
        return list(self._order)

    def demand_of(self, consumer: bytes) -> int:
        return self._demand[consumer]

    @property
    def demand(self) -> int:
        """Total outstanding demand: how many events could be delivered right now."""
        return self._total

    # -- dispatch --------------------------------------------------------------------------
    def dispatch(self, items: list[T]) -> Dispatched[T]:
        n = len(items)
        total = self._total
        if not n or not total:
            return [], items
        order = self._order
        size = len(order)
        start = self._cursor % size
        rot = order[start:] + order[:start] if start else order
        dem = self._demand
        weight = self._weight
        if n >= total:
            # Heavy load: every consumer gets all it asked for; no choice to make.
            alloc = [(c, dem[c]) for c in rot if dem[c]]
        else:
            alloc, last = self._fill(rot, n)
            self._cursor = start + last + 1
        if len(alloc) > 1:
            # The most idle consumer gets the oldest events (stable: ties keep rotation).
            alloc.sort(key=lambda cx: -dem[cx[0]] * weight[cx[0]])
        deliveries: list[tuple[bytes, list[T]]] = []
        pos = 0
        for c, x in alloc:
            end = pos + x
            deliveries.append((c, items[pos:end]))
            dem[c] -= x
            pos = end
        self._total = total - pos
        return deliveries, items[pos:]

    def _fill(self, rot: Sequence[bytes], n: int) -> tuple[list[tuple[bytes, int]], int]:
        """Water-fill ``n`` (< total demand) events; also the rotation index of the last
        tied consumer served, for the next tie-break.

        Giving consumer *i* its k-th event (k = 0, 1, …) has priority ``(r_i - k) * w_i``
        (its remaining demand before that event, scaled).  Greedy one-at-a-time dispatch
        takes the n highest priorities, so the lowest priority it takes is the largest
        level ``t`` with ``count(priority ≥ t) ≥ n`` (binary search).  Every slot above
        ``t`` is given, and the rest go, one each, to the consumers tied at exactly ``t``
        (each has at most one slot there), in rotation order.
        """
        dem = self._demand
        weight = self._weight
        act = [(j, c, dem[c], weight[c]) for j, c in enumerate(rot) if dem[c]]
        if n == 1:
            # Light load, the common case worth a shortcut: the single most idle consumer
            # (max() keeps the first of equals, i.e. rotation order).
            j, c, _, _ = max(act, key=lambda a: a[2] * a[3])
            return [(c, 1)], j

        def above(t: int) -> int:
            # how many (consumer, k) slots have priority >= t
            return sum(r - (t + w - 1) // w + 1 for _, _, r, w in act if r * w >= t)

        lo, hi = 1, max(r * w for _, _, r, w in act)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if above(mid) >= n:
                lo = mid
            else:
                hi = mid - 1
        level = lo
        alloc: list[tuple[bytes, int]] = []
        extra = n
        nxt = level + 1
        counts = []
        for _, _, r, w in act:
            x = r - (nxt + w - 1) // w + 1 if r * w >= nxt else 0
            counts.append(x)
            extra -= x
        last = 0
        for (j, c, r, w), x in zip(act, counts):
            if extra and level % w == 0 and r * w >= level:
                x += 1
                extra -= 1
                last = j
            if x:
                alloc.append((c, x))
        return alloc, last


# -- GenStage's DemandDispatcher ---------------------------------------------------------------

class GenStageDemandDispatcher:
    """GenStage's DemandDispatcher, faithfully: kept to measure what the default fixes.

    Demands are a list sorted by demand, biggest first, FIFO among equals (a consumer whose
    demand changes goes behind the others with the same demand).  A dispatch gives the
    head consumer as many events as it asked for, re-sorts, and repeats; so each consumer
    gets at most one contiguous run per call, and under light load the first subscriber
    gets everything (seed 003).  GenStage's ``pending`` bookkeeping for cancelled demand is
    not needed here: ``demand`` is recomputed from the live consumers, so a cancelled
    consumer's demand simply stops counting.
    """

    policy = "demand"

    def __init__(self) -> None:
        self._demands: list[list[Any]] = []      # [demand, consumer], biggest first
        self._max: dict[bytes, int] = {}
        self._total = 0

    def subscribe(self, consumer: bytes, max_demand: int, partition: Any = None) -> None:
        _check_max_demand(max_demand)
        if consumer in self._max:
            self.cancel(consumer)
        self._max[consumer] = max_demand
        self._demands.append([0, consumer])      # GenStage: demands ++ [{0, pid, ref}]

    def ask(self, consumer: bytes, n: int) -> None:
        _check_ask(n)
        if consumer not in self._max:
            raise KeyError(consumer)
        current = self._pop(consumer)
        self._insert(current + n, consumer)
        self._total += n

    def retract(self, consumer: bytes, n: int) -> int:
        """As :meth:`SpreadDispatcher.retract` (GenStage has no such message; a plain
        GenStage consumer never sends it, but answering it keeps the protocol total)."""
        _check_retract(n)
        if consumer not in self._max:
            raise KeyError(consumer)
        current = self._pop(consumer)
        k = min(n, current)
        self._insert(current - k, consumer)
        self._total -= k
        return k

    def cancel(self, consumer: bytes) -> None:
        if self._max.pop(consumer, None) is None:
            return
        self._total -= self._pop(consumer)

    def _pop(self, consumer: bytes) -> int:
        for i, (d, c) in enumerate(self._demands):
            if c == consumer:
                del self._demands[i]
                return d
        raise KeyError(consumer)

    def _insert(self, demand: int, consumer: bytes) -> None:
        # GenStage's add_demand: before the first entry with a strictly smaller demand.
        demands = self._demands
        i = 0
        while i < len(demands) and demands[i][0] >= demand:
            i += 1
        demands.insert(i, [demand, consumer])

    def consumers(self) -> list[bytes]:
        return [c for _, c in self._demands]

    def demand_of(self, consumer: bytes) -> int:
        for d, c in self._demands:
            if c == consumer:
                return d
        raise KeyError(consumer)

    @property
    def demand(self) -> int:
        return self._total

    def dispatch(self, items: list[T]) -> Dispatched[T]:
        n = len(items)
        if not n or not self._total:
            return [], items
        demands = self._demands
        deliveries: list[tuple[bytes, list[T]]] = []
        pos = 0
        while pos < n and demands[0][0] > 0:
            counter, consumer = demands.pop(0)
            x = min(counter, n - pos)
            deliveries.append((consumer, items[pos:pos + x]))
            pos += x
            self._insert(counter - x, consumer)
        self._total -= pos
        return deliveries, items[pos:]


# -- partitions ---------------------------------------------------------------------------------

class PartitionDispatcher:
    """Each item goes only to a consumer of its partition (``key(item)``).

    Consumers subscribe with a partition; several consumers of one partition share it
    idle-first (a :class:`SpreadDispatcher` per partition).  Items of a partition without
    demand (or without a consumer yet) stay in the leftovers, in order, so a slow
    partition holds back only its own items.  An item whose key is not one of the
    configured partitions is a routing bug upstream: :class:`ValueError`, with the
    dispatcher's state unchanged (GenStage raises too).  The same for a subscription to an
    unknown partition.

    ``demand`` is the sum of every partition's outstanding demand.  It is an upper bound,
    not a promise: fetched items can be delivered only as far as they fall into partitions
    that have demand.  A producer that fetches ``demand - len(buffer)`` therefore never
    holds more than the total demand, and items for busy partitions wait in its buffer
    until their consumer asks again.
    """

    policy = "partition"

    def __init__(self, partitions: Iterable[Hashable], key: Callable[[Any], Hashable]) -> None:
        self._parts: dict[Any, SpreadDispatcher] = {p: SpreadDispatcher() for p in partitions}
        self._key = key
        self._where: dict[bytes, Any] = {}       # consumer -> its partition
        self._total = 0

    def subscribe(self, consumer: bytes, max_demand: int, partition: Any = None) -> None:
        try:
            part = self._parts[partition]
        except (KeyError, TypeError):
            raise ValueError(f"unknown partition {partition!r}; "
                             f"partitions are {list(self._parts)!r}") from None
        if consumer in self._where:
            self.cancel(consumer)
        part.subscribe(consumer, max_demand)
        self._where[consumer] = partition

    def ask(self, consumer: bytes, n: int) -> None:
        part = self._parts[self._where[consumer]]
        part.ask(consumer, n)
        self._total += n

    def retract(self, consumer: bytes, n: int) -> int:
        k = self._parts[self._where[consumer]].retract(consumer, n)
        self._total -= k
        return k

    def cancel(self, consumer: bytes) -> None:
        """Forget the consumer and its demand (unknown consumers are ignored)."""
        if consumer not in self._where:
            return
        part = self._parts[self._where.pop(consumer)]
        self._total -= part.demand_of(consumer)
        part.cancel(consumer)

    def consumers(self) -> list[bytes]:
        return list(self._where)

    def partition_of(self, consumer: bytes) -> Any:
        return self._where[consumer]

    def demand_of(self, consumer: bytes) -> int:
        return self._parts[self._where[consumer]].demand_of(consumer)

    def partition_demand(self, partition: Any) -> int:
        return self._parts[partition].demand

    @property
    def demand(self) -> int:
        """Sum of all partitions' outstanding demand (an upper bound; see the class)."""
        return self._total

    def dispatch(self, items: list[T]) -> Dispatched[T]:
        if not items or not self._total:
            return [], items
        parts = self._parts
        # partition -> [its items this call, room left]; a partition leaves when full
        slots: dict[Any, list[Any]] = {p: [[], sd._total] for p, sd in parts.items()
                                       if sd._total}
        key = self._key
        if len(slots) == 1:
            # One partition has demand (e.g. one batcher): if the items it has room for
            # are all its own, it is one slice; the rest wait whatever their partition.
            ((p, (_, room)),) = slots.items()
            take = min(len(items), room)
            head = items[:take]
            if list(map(key, head)).count(p) == take:
                deliveries, _rest = parts[p].dispatch(head)
                self._total -= take
                return deliveries, items[take:]
        groups = list(slots.items())
        left: list[T] = []
        for i, item in enumerate(items):
            p = key(item)
            s = slots.get(p)
            if s is not None:
                s[0].append(item)
                s[1] -= 1
                if not s[1]:
                    del slots[p]
                    if not slots:
                        left.extend(items[i + 1:])
                        break
            elif p in parts:
                left.append(item)
            else:
                raise ValueError(f"item for unknown partition {p!r}; "
                                 f"partitions are {list(parts)!r}")
        deliveries: list[tuple[bytes, list[T]]] = []
        sent = 0
        for p, (group, _) in groups:
            if group:
                d, _rest = parts[p].dispatch(group)   # never leaves any: len ≤ its demand
                deliveries.extend(d)
                sent += len(group)
        self._total -= sent
        return deliveries, left
