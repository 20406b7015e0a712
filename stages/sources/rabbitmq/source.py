"""The ``rabbitmq`` source as the producer drives it: a consumer on one RabbitMQ queue
(AMQP 0-9-1, through pika).

RabbitMQ pushes (seed 001): once subscribed, the broker sends up to ``prefetch_count``
unacknowledged deliveries and then waits for acks.  So, like BroadwayRabbitMQ, this source
ignores demand on the broker side and lets the prefetch window be the back-pressure: the
deliveries are buffered (never more than the window) in a :class:`~..mailbox.Mailbox` and
handed to the producer as its consumers ask (:meth:`RabbitMQSource.fetch`).  The I/O
thread (:mod:`.connection`) owns the connection; this side only hands out deliveries and
queues the producer's settlements for it.

The mailbox's eventfd is what :meth:`~RabbitMQSource.fileno` returns.  It is written only
when the producer is known to want more (its last fetch came back short), so a producer
with no demand is never woken in a loop; a wake-up the producer did not consume (it had no
demand after all) is withdrawn after :data:`WAKE_LEASE` and offered again with a growing
delay, up to :data:`WAKE_RETRY_MAX`.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...runtime.redact import describe_error, mask_url
from ...runtime.tally import JournaledNotes, NoteRing, SentAcks
from .. import window_option
from ..base import (
    FailedItem,
    Failure,
    Item,
    Source,
    SourceError,
    failure_of,
    not_contacted,
)
from ..decode import body_decoder, decode_bodies
from ..io_ops import Ack, Fail, Pause, Reconcile, Requeue, Resume, Window
from ..mailbox import Mailbox
from .connection import Consumer
from .settings import (
    AMQP_MAX_PREFETCH,
    DEFAULT_PREFETCH,
    KNOWN_OPTIONS,
    NAME,
    RabbitMQSettings,
    parse_options,
)

if TYPE_CHECKING:
    from .replay import RabbitMQDeadLetters

log = logging.getLogger("offbroadway.sources.rabbitmq")

#: how long a wake-up may sit unconsumed before it is withdrawn, and the longest pause
#: before offering it again
WAKE_LEASE = 0.02
WAKE_RETRY_MAX = 0.5


class RabbitMQSource(Source):
    """Consumes one queue; deliveries are buffered (bounded by the prefetch window) and
    handed out by :meth:`fetch`; the producer polls :meth:`fileno`.

    ``message.data`` is the body (bytes; with ``decode``, its JSON value or text, see
    :mod:`..decode`); ``metadata`` has ``routing_key``, ``exchange``,
    ``delivery_tag``, ``redelivered``, ``queue``, ``headers`` and every AMQP property that
    is set (:mod:`.delivery`).
    """

    name = NAME
    known_options = KNOWN_OPTIONS
    window_option = window_option(NAME)

    def __init__(self, options: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(options, **kwargs)
        settings = parse_options(self.options)
        self.url_masked = mask_url(settings.url)
        # unique per process and connection incarnation, for message ids without message_id
        session = (f"{socket.gethostname()}.{os.getpid()}.{self.producer_index}."
                   f"{time.time_ns() // 1_000_000 % 10**10:x}")
        self._io = Consumer(settings, session=session, pipeline=self.pipeline,
                            producer_index=self.producer_index)
        self._mailbox: Mailbox | None = None
        self._decode = body_decoder(settings.decode)
        self.fetched = self.undecodable = 0

    @property
    def settings(self) -> RabbitMQSettings:
        """The options in force (the I/O thread's: a resize changes the window)."""
        return self._io.settings

    @classmethod
    def dead_letters(cls, options: Mapping[str, Any], *, pipeline: str,
                     state_dir: str) -> RabbitMQDeadLetters:
        from .replay import RabbitMQDeadLetters

        return RabbitMQDeadLetters(options)

    @classmethod
    def preflight(cls, options: Mapping[str, Any]) -> list[str]:
        s = parse_options(options)
        drops = s.drops_failures()
        return [not_contacted("RabbitMQ", s.url, f"the queue {s.queue!r}")] + \
            ([drops] if drops else [])

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        super().validate_options(options)
        parse_options(options)

    @classmethod
    def refused(cls, options: Mapping[str, Any], *, pipeline: str = "") -> str | None:
        from .refusal import refusal

        return refusal(parse_options(options))

    # -- lifecycle ----------------------------------------------------------------------------
    def open(self) -> None:
        """Start the I/O thread and wait for its first connection attempt.

        A configuration error the broker reports (unknown queue, access refused, wrong
        credentials) raises here, so a bad config fails at start with the broker's words.
        A broker that is merely unreachable does not: the source keeps retrying with
        backoff and ``stats()`` shows ``state = "reconnecting"``.
        """
        if self._mailbox is not None:
            return
        self._mailbox = Mailbox(lease=WAKE_LEASE, retry_max=WAKE_RETRY_MAX)
        io = self._io
        io.start(self._mailbox)
        if io.fatal is not None:
            io.stop()
            self._mailbox.close()
            self._mailbox = None
            raise SourceError(f"rabbitmq source: cannot consume queue "
                               f"{self.settings.queue!r} at {self.url_masked}: "
                               f"{describe_error(io.fatal, self.settings.url)}") from io.fatal
        s = self.settings
        if drops := s.drops_failures():
            log.warning("%s", drops)
        if s.prefetch_auto and "auto_prefetch" not in self.options:
            log.warning("rabbitmq source: prefetch_count is \"auto\" but the daemon passed no "
                        "auto_prefetch; using %d, which starves processors if processors x "
                        "max_demand (+ what batchers hold) is larger", DEFAULT_PREFETCH)
        log.info("rabbitmq source: queue %r at %s (prefetch %d%s, on_failure %s): %s",
                 s.queue, self.url_masked, s.prefetch_count,
                 " auto" if s.prefetch_auto else "", s.on_failure, io.state)

    def close(self) -> None:
        """Flush pending acks, hand unfetched deliveries back, close the connection.

        Whatever was fetched and not settled stays unacked and the broker redelivers it
        when the connection closes (at-least-once).
        """
        mailbox = self._mailbox
        if mailbox is None:
            return
        if not self._io.stop():
            log.warning("rabbitmq source: I/O thread did not stop in time")
        # closed under the mailbox's lock: an I/O thread that outlived the join must not
        # write to a closed (and perhaps reused) fd
        mailbox.close()
        self._mailbox = None
        self._io.state = "closed"

    def fileno(self) -> int | None:
        return self._mailbox.fileno() if self._mailbox is not None else None

    # -- the message flow ------------------------------------------------------------------------
    def fetch(self, n: int) -> list[Item]:
        """Hand out up to ``n`` buffered deliveries; a short answer arms the wake-up fd.

        ``fetch(0)`` only consumes a pending wake-up (a producer with no demand may call it
        so its poller does not keep reporting the fd readable).
        """
        if self._mailbox is None:
            return []
        out = self._mailbox.take(n, want_more=not self._io.paused)
        self.fetched += len(out)
        if self._decode is not None and out and decode_bodies(out, self._decode):
            self._doom_undecodable(out)
        return out

    def _doom_undecodable(self, items: list[Item]) -> None:
        """Mark the handles of bodies that did not decode as doomed: a requeue would only
        bring them back to fail again (:mod:`.settle`)."""
        for i, item in enumerate(items):
            msg_id, data, meta, handle = item
            reason = failure_of(item)
            if reason is not None and not handle.doomed:
                items[i] = FailedItem(msg_id, data, meta, handle._replace(doomed=True), reason)
                self.undecodable += 1

    def ack(self, handles: list[Any]) -> None:
        if handles:
            self._io.command(Ack(handles))

    def fail(self, failures: list[Failure]) -> None:
        if failures:
            self._io.command(Fail(failures))

    def requeue(self, handles: list[Any]) -> None:
        if handles:
            self._io.requeues_asked += 1
            self._io.command(Requeue(handles))

    def taken_back(self) -> str | None:
        """A lost connection handed every unsettled delivery back to the broker."""
        losses, why = self._io.losses, None
        while losses:         # the I/O thread appends meanwhile: popleft is thread-safe
            why = losses.popleft()
        return why

    def journal_notes(self, ring: NoteRing) -> None:
        """Write every note to ``ring`` too, as it is made (before :meth:`open`): the
        daemon reads the notes a SIGKILL kept from a report there."""
        self._io.settle.notes = JournaledNotes(ring, maxlen=self._io.settle.notes.maxlen)

    def count_acks(self, book: SentAcks) -> None:
        """Keep the count of acks sent to the broker in ``book``, with each frame as it
        leaves, by the I/O thread (before :meth:`open`); ``acks_sent`` in stats."""
        self._io.settle.sent_book = book

    def take_notes(self) -> list[list]:
        """The failure books' notes for the daemon (:mod:`.settle`), oldest first."""
        notes, out = self._io.settle.notes, []
        while notes:          # the I/O thread appends meanwhile: popleft is thread-safe
            out.append(list(notes.popleft()))
        return out

    def reconcile(self, settled: list[Any], moved: list[Any]) -> None:
        if settled or moved:
            self._io.command(Reconcile(settled, moved))

    def exhausted(self) -> bool:
        """Nothing buffered and the broker confirmed the queue has no ready message
        (:mod:`.probe`), after the last requeue we asked for.  The messages a requeue hands
        back (a crash's, a poison on its way to the dead letters among them) are in no
        queue until the broker is told (the I/O thread takes the requeue, then sends it
        in bulk): a confirmation from before would call the queue empty, and the drain
        that ``--until-idle`` begins on it would leave them there.  A queue where only
        messages that failed in this run circulate counts as exhausted too (:mod:`.probe`):
        under a requeuing policy they come back for ever, and the books say how many stay."""
        io = self._io
        io.probe.asked(time.monotonic())
        if self._mailbox is not None and len(self._mailbox):
            return False
        if io.requeues_taken != io.requeues_asked:
            return False
        return io.state == "connected" and (io.probe.empty_confirmed
                                            or io.probe.only_failures)

    def retry_after(self) -> float:
        return 1.0   # push source: the fd wakes the producer, this is never the clock

    def pause(self) -> None:
        """Stop the broker pushing (basic.cancel) and give unfetched deliveries back.

        The stop's drain and the operator's pause: the queue's other consumers (another
        daemon) get those messages at once instead of after this one closes.
        """
        self._io.paused = True
        if self._mailbox is not None:
            self._mailbox.disarm()
        self._io.command(Pause())

    def resume(self) -> None:
        self._io.paused = False
        self._io.command(Resume())

    def set_window(self, prefetch: int) -> None:
        """A resize changed the auto window: ``basic.qos`` again on the I/O thread (the
        broker applies it to deliveries from then on; a reconnect uses it too).  An
        explicit ``prefetch_count`` is kept as given."""
        if self.settings.prefetch_auto:
            self._io.command(Window(max(1, min(prefetch, AMQP_MAX_PREFETCH))))

    def stats(self) -> dict[str, Any]:
        s, io = self.settings, self._io
        settle = io.settle
        return {
            "source": self.name, "state": io.state, "url": self.url_masked,
            "failed_to": s.failed_to(),
            "queue": s.queue, "prefetch_count": s.prefetch_count,
            "prefetch_auto": s.prefetch_auto, "on_failure": s.on_failure,
            "fetched": self.fetched, "acked": settle.acked,
            # messages, not deliveries: rejected ones and those back in the queue after
            # failing here last (``failing``); ``failures`` counts the failed deliveries.
            # ``noted``: the daemon keeps the pipeline's books from this source's notes
            "failed": settle.failed, "failures": settle.failures,
            "failing": settle.counted, "failing_in": s.failing_in(), "noted": True,
            "retry_held": len(settle.cooling),
            "rejected": settle.rejected, "dead_lettered": settle.rejected,
            "failure_requeued": settle.failure_requeued,
            "rejected_final": settle.rejected_final,
            "requeued": settle.requeued,
            "buffered": len(self._mailbox) if self._mailbox is not None else 0,
            # acks settled here and not yet sent are owed to the broker still
            "unacked": settle.unacked + len(settle.unsent), "acks_pending": len(settle.unsent),
            "acks_sent": settle.acks_sent,
            "ack_frames": settle.ack_frames,
            "requeues_pending": len(settle.requeue_owed),
            "requeue_frames": settle.requeue_frames,
            "deliveries": io.deliveries,
            "redelivered": io.redelivered, "stale": settle.stale,
            "dropped_on_loss": io.dropped_on_loss, "returned": io.returned,
            "reconnects": io.reconnects, "oversized": io.oversized,
            "max_message_bytes": s.max_message_bytes,
            "decode": s.decode, "undecodable": self.undecodable,
            "incarnation": io.incarnation, "paused": io.paused,
            "last_error": io.last_error}
