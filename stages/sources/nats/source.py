"""The ``nats`` source: a durable pull consumer on one JetStream stream (nats-py).

The producer-thread face of the source: it validates options, starts the I/O thread
(:mod:`.connection`), hands out what the thread pulled (:mod:`..mailbox`) and forwards
settles.  Message id: the publisher's ``Nats-Msg-Id`` header when set (JetStream's own
de-duplication id), else ``<stream>:<stream sequence>``, stable across redeliveries.
``message.data`` is the body (bytes; with ``decode``, its JSON value or text, see
:mod:`..decode`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...runtime.redact import mask_url
from ...runtime.tally import SentAcks
from .. import window_option
from ..base import Failure, Item, Source, SourceError, not_contacted
from ..decode import body_decoder, decode_bodies
from ..io_ops import Ack, Fail, Pause, Requeue, Resume
from ..mailbox import Mailbox
from .connection import JetStreamPuller
from .settings import DEFAULT_PREFETCH, KNOWN_OPTIONS, NAME, NatsSettings, parse_options

if TYPE_CHECKING:
    from .replay import NatsDeadLetters

log = logging.getLogger("offbroadway.sources.nats")


class NatsSource(Source):
    """Pulls from a durable JetStream consumer within a ``prefetch`` window; the producer
    polls :meth:`fileno`."""

    name = NAME
    known_options = KNOWN_OPTIONS
    window_option = window_option(NAME)

    def __init__(self, options: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(options, **kwargs)
        self.settings: NatsSettings = parse_options(self.options, pipeline=self.pipeline)
        self.fetched = self.undecodable = 0
        self._decode = body_decoder(self.settings.decode)
        self._mailbox: Mailbox | None = None
        self._io: JetStreamPuller | None = None
        self._sent_book: SentAcks | None = None

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        super().validate_options(options)
        parse_options(options)

    @classmethod
    def refused(cls, options: Mapping[str, Any], *, pipeline: str = "") -> str | None:
        from .refusal import refusal

        return refusal(parse_options(options, pipeline=pipeline))

    @classmethod
    def preflight(cls, options: Mapping[str, Any]) -> list[str]:
        s = parse_options(options)
        return [not_contacted("NATS", s.url, f"the stream {s.stream!r}")]

    @classmethod
    def dead_letters(cls, options: Mapping[str, Any], *, pipeline: str,
                     state_dir: str) -> NatsDeadLetters:
        from .replay import NatsDeadLetters

        return NatsDeadLetters(options, pipeline)

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self) -> None:
        """Start the I/O thread and wait for its first connection attempt.

        A stream that does not exist, or a consumer that cannot work (push, or not explicit
        acks) raises here, with the server's words; an unreachable server does not: the
        source keeps retrying and ``stats()`` shows ``state = "reconnecting"``.
        """
        if self._io is not None:
            return
        s = self.settings
        self._mailbox = Mailbox()
        name = f"{self.pipeline} producer_{self.producer_index} {socket.gethostname()}." \
               f"{os.getpid()}"
        self._io = JetStreamPuller(s, self._mailbox, client_name=name)
        self._io.sent_book = self._sent_book
        self._io.start()
        self._io.first_attempt.wait(s.connect_timeout + 5.0)
        if self._io.fatal is not None:
            fatal = self._io.fatal
            self._io.stop(5.0)
            self._io = None
            self._mailbox.close()
            self._mailbox = None
            raise SourceError(f"nats source: cannot consume {s.stream}/{s.consumer} at "
                               f"{self._url()}: {fatal}") from fatal
        if s.prefetch_auto and "auto_prefetch" not in self.options:
            log.warning("nats source: prefetch is \"auto\" but the daemon passed no "
                        "auto_prefetch; using %d", DEFAULT_PREFETCH)
        log.info("nats source: stream %r consumer %r at %s (prefetch %d%s, max_deliver %d, "
                 "dead letters %s): %s", s.stream, s.consumer, self._url(), s.prefetch,
                 " auto" if s.prefetch_auto else "", s.max_deliver,
                 s.dead_letter_subject or "terminated", self._io.state)

    def close(self) -> None:
        """Give back what was not handed out, flush settles, disconnect.  What was handed
        out and not settled stays unacknowledged: the server redelivers it after
        ``ack_wait``."""
        io, mailbox = self._io, self._mailbox
        if io is None or mailbox is None:
            return
        if not io.stop(self.settings.connect_timeout * 2 + 5.0):
            log.warning("nats source: I/O thread did not stop in time")
        self._io = None
        mailbox.close()

    def fileno(self) -> int | None:
        return self._mailbox.fileno() if self._mailbox is not None else None

    # -- the message flow ----------------------------------------------------------------------
    def fetch(self, n: int) -> list[Item]:
        if self._mailbox is None or self._io is None:
            return []
        out = self._mailbox.take(n, want_more=not self._io.paused)
        self.fetched += len(out)
        if self._decode is not None and out:
            self.undecodable += decode_bodies(out, self._decode)
        return out

    def count_acks(self, book: SentAcks) -> None:
        """Keep the count of acks the server has read in ``book``, by the I/O thread
        (before :meth:`open`); ``acks_sent`` in stats."""
        self._sent_book = book

    def ack(self, handles: list[Any]) -> None:
        if handles and self._io is not None:
            self._io.post(Ack(handles))

    def fail(self, failures: list[Failure]) -> None:
        if failures and self._io is not None:
            self._io.post(Fail(failures))

    def requeue(self, handles: list[Any]) -> None:
        if handles and self._io is not None:
            self._io.post(Requeue(handles))

    def exhausted(self) -> bool:
        """Nothing buffered, and the server confirmed (twice, no delivery between) that the
        consumer has nothing undelivered and nothing ack-pending beyond what this source
        holds (a message nak'ed with a delay is ack-pending: it will come back)."""
        io, mailbox = self._io, self._mailbox
        if io is None or mailbox is None:
            return False
        io.idle_asked_at = time.monotonic()
        return not len(mailbox) and io.state == "connected" and io.empty_confirmed

    def retry_after(self) -> float:
        return 1.0   # the fd wakes the producer; this is never the clock

    def set_window(self, prefetch: int) -> None:
        """A resize changed the auto window: the pull loop keeps that many owed from its
        next pull (an explicit ``prefetch`` is kept as given)."""
        if self.settings.prefetch_auto:
            self.settings = dataclasses.replace(self.settings, prefetch=prefetch)
            if self._io is not None:
                self._io.prefetch = prefetch

    def pause(self) -> None:
        """Stop pulling and hand what was pulled but not fetched back (``-NAK``), so other
        consumers of the durable get it at once."""
        if self._io is None or self._mailbox is None:
            return
        self._io.paused = True
        self._mailbox.disarm()
        self._io.post(Pause())

    def resume(self) -> None:
        if self._io is not None:
            self._io.paused = False
            self._io.post(Resume())

    def stats(self) -> dict[str, Any]:
        s, io = self.settings, self._io
        out: dict[str, Any] = {
            "source": self.name, "url": self._url(), "stream": s.stream,
            "consumer": s.consumer, "prefetch": s.prefetch, "prefetch_auto": s.prefetch_auto,
            "max_deliver": s.max_deliver, "fetched": self.fetched,
            "decode": s.decode, "undecodable": self.undecodable,
            "buffered": len(self._mailbox) if self._mailbox is not None else 0}
        if io is None:
            out.update(state="closed", unacked=0)
            return out
        out.update(
            state=io.state, last_error=io.last_error,
            # acks published and not yet confirmed are owed still
            unacked=len(io.owed) + io.acks_unconfirmed, acks_sent=io.acked,
            deliveries=io.deliveries, redelivered=io.redelivered, acked=io.acked,
            # messages, not deliveries: those failed for good (terminated, after a dead
            # letter if one is set) and those nak'ed after failing (``failing``);
            # ``failures`` counts the failed deliveries, ``naked`` the naks among them
            failed=io.terminated + len(io.failing), failures=io.failures,
            rejected=io.terminated, failure_requeued=io.naked, failing=len(io.failing),
            failing_in=s.failing_in(), naked=io.naked, terminated=io.terminated,
            dead_lettered=io.dead_lettered, dead_letter_errors=io.dead_letter_errors,
            requeued=io.requeued, returned=io.returned, stale=io.stale,
            reconnects=io.reconnects, progress_sent=io.progress_sent,
            oversized=io.oversized, pull_errors=io.pull_errors, paused=io.paused)
        return out

    def _url(self) -> str:
        return mask_url(self.settings.url)
