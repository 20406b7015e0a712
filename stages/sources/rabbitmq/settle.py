"""Settling deliveries on one channel: each tag once, acks as ``multiple`` acks.

Acknowledgement rules: a handle names the connection incarnation it came from; after a
connection loss the broker requeues everything that connection held, so handles of a dead
incarnation are dropped (counted as ``stale``), never acked on the new channel where the
same delivery tag means another message.  Each delivery tag is settled at most once.

Acks go out as ``multiple`` acks, one per I/O pass: every ack the producer sent since the
last pass is collected, and the broker is told "up to tag T" for the longest run of
settled tags at the front of the delivery order.  A settled tag behind one still open
(two processors finish their frames in either order) waits for the front to reach it;
when the front has not moved for :data:`ACK_DELAY`, what waits behind it is acked tag by
tag, so a long job at the front never holds the others' acks (nor their prefetch slots)
for long.  Each ack is a frame and, through pika's ``BlockingChannel``, a flush with a
poll of the socket: one per message was most of this source's cost at a few thousand
messages a second.  Rejects (failures, requeues) go out at once.

Used by the I/O thread only; the channel is anything with pika's ``basic_ack`` and
``basic_reject``.

Failure policies and retries.  ``reject_and_requeue`` (the default) and
``reject_and_requeue_once`` send a failed message back to the queue; but a message that can
only fail again is rejected instead, whatever the policy: a poison message (it killed a
processor ``max_crashes`` times: requeued, it would start the crash loop over, since the
producer forgets its strikes once it settles, and the pipeline supervisor would give up
within a few rounds), and a message the source itself failed for what it is (``doomed``:
over ``max_message_bytes``, or a body ``decode`` could not parse).  Requeued, those would
come straight back at the speed of the pipeline for ever.  Rejected, they go to the
queue's dead-letter exchange; a queue without one drops them, which is why they are
counted (``rejected_final``) and logged one line per burst.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

from ...poison.guard import POISON_REASON
from ..base import Failure
from .delivery import RabbitMQHandle
from .settings import ALWAYS_REQUEUE

log = logging.getLogger("offbroadway.sources.rabbitmq")

#: the longest an ack behind a still-open tag waits for a multiple ack to cover it
ACK_DELAY = 0.05


class Settlement:
    """The unsettled deliveries of the live channel and the acks the broker is owed."""

    def __init__(self, on_failure: str) -> None:
        self.on_failure = on_failure
        self.channel: Any = None
        self.incarnation = 0
        self.open_tags: set[int] = set()     # delivered on this incarnation, unsettled
        self._order: deque[int] = deque()    # delivery order, settled ones lazily removed
        self.unsent: set[int] = set()        # settled ok, the broker not told yet
        self._unsent_since = 0.0             # when the oldest of those was settled
        self.acked = self.failed = self.rejected = self.failure_requeued = 0
        #: failed messages a requeuing policy rejected: they would only fail again
        self.rejected_final = 0
        self.requeued = self.stale = 0
        self.ack_frames = 0                  # basic.ack frames sent (multiple or single)

    def attach(self, channel: Any, incarnation: int) -> None:
        """A new connection: nothing of the old one can be settled any more."""
        self.detach()
        self.channel, self.incarnation = channel, incarnation

    def detach(self) -> None:
        """The connection is gone: the broker redelivers all it held (acks not sent
        included: at-least-once)."""
        self.channel = None
        self.open_tags.clear()
        self._order.clear()
        self.unsent.clear()

    def delivered(self, tag: int) -> None:
        self.open_tags.add(tag)
        self._order.append(tag)

    # -- the producer's settlements ------------------------------------------------------------
    def ack(self, handles: list[RabbitMQHandle]) -> None:
        """Settle each live tag once; the broker is told in :meth:`send_acks`."""
        open_tags, unsent = self.open_tags, self.unsent
        inc = self.incarnation
        live = self.channel is not None
        before = len(unsent)
        for h in handles:
            tag = h.tag
            if h.incarnation != inc or not live or tag not in open_tags:
                self.stale += 1
                continue
            open_tags.discard(tag)
            unsent.add(tag)
        if len(unsent) > before:
            self.acked += len(unsent) - before
            if not before:
                self._unsent_since = time.monotonic()

    def fail(self, failures: list[Failure]) -> None:
        """The failure policy: reject (to the dead-letter exchange), or requeue."""
        final = []
        for handle, reason in failures:
            if self._current(handle):
                requeue = self._failure_requeues(handle)
                if requeue and (handle.doomed or str(reason).startswith(POISON_REASON)):
                    requeue = False
                    final.append(reason)
                if self.settle_one(handle.tag, requeue=requeue):
                    self.failed += 1
                    if requeue:
                        self.failure_requeued += 1
                    else:
                        self.rejected += 1
        if final:
            self.rejected_final += len(final)
            log.warning("rabbitmq source: %d failed message(s) rejected, not requeued "
                        "(on_failure = %s), because they would fail again (first: %s); "
                        "they go to the queue's dead-letter exchange, or are dropped by the "
                        "broker if it has none", len(final), self.on_failure, final[0])

    def requeue(self, handles: list[RabbitMQHandle]) -> None:
        for handle in handles:
            if self._current(handle) and self.settle_one(handle.tag, requeue=True):
                self.requeued += 1

    def give_back(self, handles: list[RabbitMQHandle]) -> int:
        """Requeue deliveries the producer never fetched; how many went back."""
        return sum(1 for h in handles if h.incarnation == self.incarnation
                   and self.settle_one(h.tag, requeue=True))

    def settle_one(self, tag: int, *, requeue: bool) -> bool:
        """basic.reject one tag, once.  False if it was settled already."""
        if tag not in self.open_tags:
            self.stale += 1
            return False
        self.open_tags.discard(tag)
        self.channel.basic_reject(tag, requeue=requeue)
        return True

    def _current(self, handle: RabbitMQHandle) -> bool:
        """Is this handle from the live connection?  If not, the broker already requeued
        it and its tag may name another message now: never settle it."""
        if handle.incarnation == self.incarnation and self.channel is not None:
            return True
        self.stale += 1
        return False

    def _failure_requeues(self, handle: RabbitMQHandle) -> bool:
        if self.on_failure in ALWAYS_REQUEUE:
            return True
        if self.on_failure == "reject_and_requeue_once":
            return not handle.redelivered
        return False

    # -- telling the broker ----------------------------------------------------------------------
    def send_acks(self, now: float = 0.0, *, force: bool = False) -> float:
        """Tell the broker what was settled: one ``multiple`` ack for the settled front.

        Every tag at the front of the delivery order that is no longer open was settled
        (acked, rejected or requeued); a multiple ack up to the last unsent ack among them
        acks exactly those (rejects went out at once, on the same channel, before it).
        Acks behind a still-open tag wait while the front moves; once it has stood still
        for :data:`ACK_DELAY` since they came (or on ``force``) they go one by one.
        Returns the seconds until the next call is due.
        """
        unsent = self.unsent
        if not unsent or self.channel is None:
            return ACK_DELAY
        open_tags, order = self.open_tags, self._order
        upto = 0
        covered = []
        while order and order[0] not in open_tags:
            t = order.popleft()
            if t in unsent:
                upto = t
                covered.append(t)
        channel = self.channel
        if upto:
            channel.basic_ack(upto, multiple=True)
            self.ack_frames += 1
            unsent.difference_update(covered)   # after the count: stats() reads both
        if not unsent:
            return ACK_DELAY
        if upto:
            self._unsent_since = now or time.monotonic()  # the front moved: wait again
        due = self._unsent_since + ACK_DELAY - (now or time.monotonic())
        if force or due <= 0:
            for t in sorted(unsent):
                channel.basic_ack(t)
            self.ack_frames += len(unsent)
            unsent.clear()
            return ACK_DELAY
        return due
