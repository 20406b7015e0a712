"""Settling deliveries on one channel: each tag once, acks as ``multiple`` acks.

Acknowledgement rules: a handle names the connection incarnation it came from; after a
connection loss the broker requeues everything that connection held, so handles of a dead
incarnation are dropped (counted as ``stale``), never acked on the new channel where the
same delivery tag means another message.  Each delivery tag is settled at most once.

Acks go out as ``multiple`` acks, one per I/O pass: every ack the producer sent since the
last pass is collected, and the broker is told "up to tag T" for the longest run of
settled tags at the front of the delivery order.  A settled tag behind one still open
(two processors finish their frames in either order) waits for the front to reach it;
when the front has not moved for :data:`ACK_DELAY`, what waits behind only a few open
tags (:data:`SINGLE_ACK_AHEAD`) is acked tag by tag, so a long job at the front never
holds the others' acks (nor their prefetch slots) for long.  Not behind many: the broker
finds a single ack's tag by walking its channel's unacknowledged deliveries from the
oldest, so each costs it as many steps as deliveries are still open before it.  Here
(RabbitMQ 3.10) 41,000 single acks behind 1,000 open tags kept the channel busy 4.8 s,
delivering nothing meanwhile; behind 64, 0.02 s.  That was the Spark path's stall: a
batch's stragglers (tags a processor handed on late, in the next batch) stay open until
the next commit, and the 8,500 acks behind them sent one by one stopped deliveries for
4-5 s of a 15 s run.  Those wait for the front now; it moves at the next commit.  Each
ack is a frame and, through pika's ``BlockingChannel``, a flush with a poll of the
socket: one per message was most of this source's cost at a few thousand messages a
second.  Failures are rejected at once, one ``basic.reject`` each.

Requeues (the deliveries of a crashed stage, the ones the producer never fetched) go back
the same way as acks: marked, then handed back with one ``basic.nack`` (``multiple``,
``requeue``) for each run of them at the front of the delivery order.  They are not sent
one by one because the broker cannot take that at scale: a classic queue puts a single
requeued delivery back in a time that grows with what the channel holds, so a batch
processor's death that returned a 65,000-delivery window one ``basic.reject`` at a time
kept this machine's RabbitMQ busy for minutes (about 250 a second) while it delivered
nothing; the same 65,000 in one bulk operation are back in a tenth of a second
(docs/reliability.md).  A requeue behind a tag still open waits for the front to reach
it, like an ack; only a few (:data:`SINGLE_REQUEUES`) go one by one once the front has
stood still for :data:`REQUEUE_DELAY`, so a long job at the front never holds a poison
message's retry.  Waiting loses nothing: at a close or a connection loss the broker
requeues every delivery the channel still holds.

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

Failures are counted per message, not per delivery.  A message that failed and went back to
the queue is kept in :attr:`Settlement.failing` under its identity (the handle's ``key``)
until it is acked or rejected, so it counts once however often it comes back (``failed`` =
rejected + failing; ``failures`` counts the failed deliveries).  Its second and later
failures in this run are held back before they are requeued (``RETRY_BASE`` doubling up to
``RETRY_MAX``): a message that fails on every delivery would otherwise come back at the speed
of the pipeline and keep a core busy for ever.  While held it stays unsettled on the channel
(an ack ``multiple`` must never cover it), so a stop or a lost connection hands it back to
the broker like any other unsettled delivery.  :meth:`Settlement.only_failures_left` tells
the idle probe when everything still in circulation is such a message: ``--until-idle``
then stops instead of waiting for a queue that cannot empty.

Several producers on one queue.  Each producer's channel sees only its own deliveries: a
message that failed here and was requeued may come back to a sibling producer of the
same daemon and be acked or rejected there.  So the books are told to the daemon as
notes (:attr:`Settlement.notes`, drained by the producer with each report): the message's
digest (``hash`` of its key: the producers of a daemon share their hash seed) and the
time, for every failure that went back to the queue and for every *redelivered* message
settled for good (acked or rejected; a message that never went back to the queue cannot
be in anyone's books, so first deliveries, the hot path, note nothing).  The daemon keeps
the pipeline's books from them (``offbroadway.daemon.core.failing``) and tells each
producer what left its books elsewhere (:meth:`Settlement.reconcile`): a message settled
by a sibling since its failure here is dropped; one that failed again on a sibling stays
known here (it is still in circulation, and fails: the idle probe must count it) but is
the sibling's to count (:attr:`Settlement.elsewhere`), so the producers' figures add up
to each failed message once.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Iterable

from ...poison.guard import POISON_REASON
from ...runtime.tally import DOUBT_MAX, SentAcks
from ...wire.commands import NOTE_FAILED, NOTE_SETTLED
from ..base import Failure
from .delivery import RabbitMQHandle
from .settings import ALWAYS_REQUEUE

log = logging.getLogger("offbroadway.sources.rabbitmq")

#: the longest an ack behind a still-open tag waits for a multiple ack to cover it
ACK_DELAY = 0.05
#: an ack behind at most this many open tags may go alone once the front stands still;
#: one behind more waits for the front (the broker's cost of a single ack grows with the
#: open tags before it: the module's doc)
SINGLE_ACK_AHEAD = 64
#: how long requeues behind a still-open tag wait before the few below go one by one
REQUEUE_DELAY = 0.5
#: at most this many requeues behind an open tag go as single ``basic.reject`` frames;
#: more wait for the front (a bulk ``basic.nack``), or the close that requeues them all
SINGLE_REQUEUES = 64
#: a failed message's n-th failure in this run (n >= 2) is requeued after
#: ``RETRY_BASE * 2 ** (n - 2)`` seconds, at most ``RETRY_MAX``; the first goes back at once
RETRY_BASE = 0.1
RETRY_MAX = 5.0
#: notes kept for the daemon at most (a report drains them every second): a redelivery of
#: a whole crashed window settled within a second fits
NOTES_MAX = 1 << 18


def retry_delay(strikes: int) -> float:
    """How long the ``strikes``-th failure of a message is held before its requeue."""
    if strikes < 2:
        return 0.0
    return min(RETRY_MAX, RETRY_BASE * 2 ** min(strikes - 2, 30))


class Settlement:
    """The unsettled deliveries of the live channel and the acks the broker is owed."""

    def __init__(self, on_failure: str) -> None:
        self.on_failure = on_failure
        self.channel: Any = None
        self.incarnation = 0
        self.open_tags: set[int] = set()     # delivered on this incarnation, unsettled
        self._order: deque[int] = deque()    # delivery order, settled ones lazily removed
        #: settled ok, the broker not told yet: tag -> the message's key (its digest goes
        #: with the frame that acks it: :class:`~offbroadway.stages.runtime.tally.SentAcks`)
        self.unsent: dict[int, Any] = {}
        self._unsent_since = 0.0             # when the oldest of those was settled
        self.requeue_owed: set[int] = set()  # to requeue, the broker not told yet
        self._requeue_since = 0.0            # when the front last moved with some owed
        self.acked = self.rejected = self.failure_requeued = 0
        #: acks the broker was sent (``acked`` counts them as settled, before they leave),
        #: and where that count is kept for the daemon, with the frame on its way, if
        #: anywhere (the producer's tally)
        self.acks_sent = 0
        self.sent_book: SentAcks | None = None
        #: failed deliveries (a message requeued after failing can fail again)
        self.failures = 0
        #: key -> failures in this run, of the messages that failed and went back to the
        #: queue (or are held before going back) and were not settled otherwise since
        self.failing: dict[Any, int] = {}
        #: the keys of ``failing`` that failed again on a sibling producer since they
        #: failed here: known, not counted here (see the module's doc)
        self.elsewhere: set[Any] = set()
        #: digest -> (key, when it last failed here), for the keys of ``failing``
        self._digests: dict[int, tuple[Any, float]] = {}
        #: (NOTE_FAILED or NOTE_SETTLED, digest, when) for the daemon; the producer drains
        self.notes: deque[tuple[int, int, float]] = deque(maxlen=NOTES_MAX)
        #: open tags of redelivered messages: only their settlements are noted
        self.redelivered_open: set[int] = set()
        #: tag -> when it is requeued: failures held back (see :func:`retry_delay`)
        self.cooling: dict[int, float] = {}
        #: failed messages a requeuing policy rejected: they would only fail again
        self.rejected_final = 0
        self.requeued = self.stale = 0
        self.ack_frames = 0                  # basic.ack frames sent (multiple or single)
        self.requeue_frames = 0              # basic.nack/reject frames that requeued

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
        self.requeue_owed.clear()
        self.cooling.clear()          # the broker has them back
        self.redelivered_open.clear()

    @property
    def owed(self) -> bool:
        """Has the broker settlements to be told (see :meth:`send_acks`)?"""
        return bool(self.unsent or self.requeue_owed or self.cooling)

    @property
    def failed(self) -> int:
        """Messages failed in this run: rejected, or back in the queue after failing
        (here last: :attr:`counted`)."""
        return self.rejected + self.counted

    @property
    def counted(self) -> int:
        """The messages of ``failing`` this producer counts: those that did not fail on a
        sibling since (each failing message is counted by the producer it failed on last)."""
        return max(0, len(self.failing) - len(self.elsewhere))

    @property
    def unacked(self) -> int:
        """Deliveries this channel holds unsettled, failures held before their requeue
        not included (they are settled: the broker gets them back whatever happens)."""
        return len(self.open_tags) - len(self.cooling)

    def only_failures_left(self, ready: int) -> bool:
        """With ``ready`` messages in the queue (the broker's count): is every message
        still in circulation one that failed in this run?  Everything in circulation is
        the queue's ready messages and what this channel holds; each failing message is
        one of them, so when they add up to no more than ``failing``, nothing else is
        there (exact with one consumer on the queue; with sibling producers, ``failing``
        loses what they settled once the daemon says so: :meth:`reconcile`)."""
        failing = len(self.failing)
        if not failing or self.requeue_owed or self.unsent or self.channel is None:
            return False
        return 0 < ready + len(self.open_tags) <= failing
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
        failing = self.failing
        if self.redelivered_open:
            # noted before the tags leave ``open_tags``: a report whose ``unacked`` says
            # they are settled carries their notes (the producer reads stats, then notes)
            self._note_settled(handles)
        for h in handles:
            tag = h.tag
            if h.incarnation != inc or not live or tag not in open_tags:
                self.stale += 1
                continue
            open_tags.discard(tag)
            unsent[tag] = h.key
            if failing and h.key in failing:
                self._forget(h.key)          # it failed before, and now it went through
        if len(unsent) > before:
            self.acked += len(unsent) - before
            if not before:
                self._unsent_since = time.monotonic()

    def _note_settled(self, handles: list[RabbitMQHandle]) -> None:
        """Note the redelivered messages among ``handles`` that :meth:`ack` settles (open
        on this incarnation: their tag is in :attr:`redelivered_open`)."""
        rd, inc, notes, now = self.redelivered_open, self.incarnation, self.notes, 0.0
        for h in handles:
            if h.tag in rd and h.incarnation == inc:
                rd.discard(h.tag)
                if h.key is not None:
                    now = now or time.monotonic()
                    notes.append((NOTE_SETTLED, hash(h.key), now))

    def _forget(self, key: Any) -> None:
        """``key`` left the books: acked or rejected (here or on a sibling)."""
        del self.failing[key]
        self.elsewhere.discard(key)
        self._digests.pop(hash(key), None)

    def reconcile(self, settled: Iterable[Any], moved: Iterable[Any]) -> None:
        """What the daemon says of the messages in these books, as ``(digest, when)``
        pairs: ``settled`` were acked or rejected by a sibling producer, ``moved`` failed
        again on one.  Only what happened after this producer's own last failure of the
        message counts (a late word says nothing of a later failure here)."""
        digests = self._digests
        for digest, when in settled:
            entry = digests.get(digest)
            if entry is not None and entry[1] < when:
                self._forget(entry[0])
        for digest, when in moved:
            entry = digests.get(digest)
            if entry is not None and entry[1] < when:
                self.elsewhere.add(entry[0])

    def fail(self, failures: list[Failure]) -> None:
        """The failure policy: reject (to the dead-letter exchange), or requeue; a
        message's second and later failures are held before they are requeued
        (:func:`retry_delay`)."""
        final = []
        failing, now = self.failing, 0.0
        for handle, reason in failures:
            if not self._current(handle):
                continue
            tag = handle.tag
            if tag not in self.open_tags or tag in self.cooling:
                self.stale += 1
                continue
            self.failures += 1
            requeue = self._failure_requeues(handle)
            if requeue and (handle.doomed or str(reason).startswith(POISON_REASON)):
                requeue = False
                final.append(reason)
            key = handle.key
            now = now or time.monotonic()
            if handle.redelivered:
                self.redelivered_open.discard(tag)
            if not requeue:
                if key in failing:
                    self._forget(key)
                if handle.redelivered and key is not None:
                    self.notes.append((NOTE_SETTLED, hash(key), now))
                self.rejected += 1
                self.settle_one(tag, requeue=False)
                continue
            self.failure_requeued += 1
            strikes = failing.get(key, 0) + 1
            failing[key] = strikes
            digest = hash(key)
            self._digests[digest] = (key, now)
            self.elsewhere.discard(key)       # failed here last: counted here
            self.notes.append((NOTE_FAILED, digest, now))
            if strikes < 2:
                self.settle_one(tag, requeue=True)
                continue
            self.cooling[tag] = now + retry_delay(strikes)
        if final:
            self.rejected_final += len(final)
            log.warning("rabbitmq source: %d failed message(s) rejected, not requeued "
                        "(on_failure = %s), because they would fail again (first: %s); "
                        "they go to the queue's dead-letter exchange, or are dropped by the "
                        "broker if it has none", len(final), self.on_failure, final[0])

    def release_cooling(self, now: float = 0.0, *, all_: bool = False) -> float:
        """Requeue the held failures that are due (every one with ``all_``: a pause or a
        stop); the seconds until the next is due."""
        cooling = self.cooling
        if not cooling or self.channel is None:
            return RETRY_MAX
        now = now or time.monotonic()
        due = [t for t, at in cooling.items() if all_ or at <= now]
        for t in due:
            del cooling[t]
            self.settle_one(t, requeue=True)
        return max(0.0, min(cooling.values()) - now) if cooling else RETRY_MAX

    def requeue(self, handles: list[RabbitMQHandle]) -> None:
        """Hand deliveries back to the queue (a crashed stage's); sent in bulk by
        :meth:`send_acks`."""
        self.requeued += self._owe_requeue(h for h in handles if self._current(h))

    def give_back(self, handles: list[RabbitMQHandle]) -> int:
        """Requeue deliveries the producer never fetched; how many go back."""
        return self._owe_requeue(h for h in handles if h.incarnation == self.incarnation)

    def _owe_requeue(self, handles: Iterable[RabbitMQHandle]) -> int:
        open_tags, owed = self.open_tags, self.requeue_owed
        before = len(owed)
        rd = self.redelivered_open
        for h in handles:
            if h.tag in open_tags:
                open_tags.discard(h.tag)
                owed.add(h.tag)
                if rd:
                    rd.discard(h.tag)         # back to the queue, not settled
            else:
                self.stale += 1
        if before == 0 and owed:
            self._requeue_since = time.monotonic()
        return len(owed) - before

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
        """Tell the broker what was settled: one ``multiple`` frame per run at the front.

        Every tag at the front of the delivery order that is no longer open was settled:
        acked, requeued, or rejected (rejects went out at once).  The front is walked in
        order and each run of acks becomes one ``basic.ack`` and each run of requeues one
        ``basic.nack`` with ``requeue``, both ``multiple`` up to the run's last tag: since
        everything before the run was told already, that frame settles exactly the run.
        What waits behind a still-open tag: acks go one by one once the front has stood
        still for :data:`ACK_DELAY` since they came (or on ``force``); requeues once it has
        stood still for :data:`REQUEUE_DELAY`, and only if they are few
        (:data:`SINGLE_REQUEUES`).  Returns the seconds until the next call is due.
        """
        unsent, owed = self.unsent, self.requeue_owed
        if not (unsent or owed) or self.channel is None:
            return ACK_DELAY
        now = now or time.monotonic()
        open_tags, order, channel = self.open_tags, self._order, self.channel
        run: list[int] = []                   # the run being collected at the front
        run_acks = moved = False
        while order and order[0] not in open_tags:
            t = order.popleft()
            if t in unsent:
                is_ack = True
            elif t in owed:
                is_ack = False
            else:
                continue                      # rejected at once: the broker knows
            if run and is_ack != run_acks:
                self._send_run(channel, run, run_acks)
                run = []
            run.append(t)
            run_acks, moved = is_ack, True
        if run:
            self._send_run(channel, run, run_acks)
        due = ACK_DELAY
        if unsent:
            if moved:
                self._unsent_since = now      # the front moved: wait again
            left = self._unsent_since + ACK_DELAY - now
            if force:
                for t in sorted(unsent):
                    self._ack_frame(channel, t, [t])
                unsent.clear()
            elif left <= 0:
                self._send_singles(channel)
                if unsent:
                    self._unsent_since = now   # behind many open tags: look again later
            else:
                due = left
        if owed:
            if moved:
                self._requeue_since = now
            left = self._requeue_since + REQUEUE_DELAY - now
            if left <= 0 and len(owed) <= SINGLE_REQUEUES:
                for t in sorted(owed):
                    channel.basic_reject(t, requeue=True)
                self.requeue_frames += len(owed)
                owed.clear()
            else:
                due = min(due, max(left, ACK_DELAY))
        return due

    def _send_singles(self, channel: Any) -> None:
        """Ack tag by tag what waits behind at most :data:`SINGLE_ACK_AHEAD` open tags,
        walking the delivery order from the front; the rest waits for the front."""
        open_tags, unsent, owed = self.open_tags, self.unsent, self.requeue_owed
        ahead = 0
        due: list[int] = []
        for t in self._order:
            if t in unsent:
                due.append(t)
                if len(due) == len(unsent):
                    break
            elif t in open_tags or t in owed:     # unsettled at the broker
                ahead += 1
                if ahead > SINGLE_ACK_AHEAD:
                    break
        # sent after the walk: pika's flush of each frame reads the socket too, and a
        # delivery it dispatches meanwhile appends to the order being walked
        for t in due:
            self._ack_frame(channel, t, [t])
        for t in due:
            del unsent[t]

    def _ack_frame(self, channel: Any, tag: int, tags: list[int],
                   multiple: bool = False) -> None:
        """One ``basic.ack`` frame settling ``tags`` (up to ``tag``, or ``tag`` alone),
        counted once it has left; described before it leaves, so that a death between
        the two leaves it in doubt, not lost from the books (:class:`SentAcks`)."""
        book = self.sent_book
        if book is not None:
            unsent = self.unsent
            book.leaving([hash(unsent[t]) for t in tags], self.acks_sent)
        channel.basic_ack(tag, multiple=multiple)
        self.ack_frames += 1
        self.acks_sent += len(tags)
        if book is not None:
            book.left(self.acks_sent)

    def _send_run(self, channel: Any, run: list[int], acks: bool) -> None:
        """One ``multiple`` frame up to the run's last tag: it settles the run, since
        every tag before it was told already (a run longer than a frame may describe goes
        as several, in order)."""
        if acks:
            unsent = self.unsent
            for at in range(0, len(run), DOUBT_MAX):
                frame = run[at:at + DOUBT_MAX]
                self._ack_frame(channel, frame[-1], frame, multiple=True)
                for t in frame:       # after the frame: stats() reads both
                    del unsent[t]
        else:
            channel.basic_nack(run[-1], multiple=True, requeue=True)
            self.requeue_frames += 1
            self.requeue_owed.difference_update(run)
