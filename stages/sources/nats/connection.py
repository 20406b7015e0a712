"""The NATS source's I/O thread: one asyncio loop owning the connection and the pull.

nats-py is asyncio-only and the producer's loop is a synchronous poller, so the client
lives in a thread of its own (as pika does for the ``rabbitmq`` source).  The producer
thread talks to it only through :meth:`JetStreamPuller.post` (a deque plus
``call_soon_threadsafe``) and receives messages through the :class:`~..mailbox.Mailbox`.

What the thread does:

* *pull within the window*: while fewer than ``prefetch`` messages are owed (pulled and not
  settled, wherever they are), one pull request for the difference (at most
  :data:`~.settings.MAX_PULL_BATCH`).  The window is the back-pressure, exactly like
  RabbitMQ's ``prefetch_count``: a stalled pipeline stops settling, so the pull stops;
* *settle* what the producer hands back: ``+ACK``; ``-NAK`` with ``nak_delay`` for a
  failure below ``max_deliver`` deliveries; at ``max_deliver``, a copy to the dead-letter
  subject (through JetStream, so it is stored before the original goes) and ``+TERM``;
  ``-NAK`` at once for a requeue (a stage died holding it).  Each delivery is settled at
  most once (its reply subject leaves the owed table), and a settle that cannot be sent
  (disconnected, buffer full) is retried, never dropped;
* *keep owned messages owned*: every ``ack_wait / 3`` a ``+WPI`` (work in progress) for what
  is still owed, so a slow batch is not redelivered to another daemon while this one lives;
  a dead daemon stops sending them and the server redelivers after ``ack_wait``;
* *probe for idleness* while the producer asks ``exhausted()`` (``--until-idle``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.errors import NotJSMessageError
from nats.js import api

from ...runtime.redact import mask_url
from ...runtime.tally import SentAcks
from ..base import Item
from ..io_ops import Ack, Fail, IoOp, Pause, Requeue, Resume
from ..mailbox import Mailbox
from .delivery import DEAD_LETTER_HEADER as DEAD_LETTER_HEADER  # the name tests import from here
from .delivery import NatsHandle, dead_letter_headers, to_item
from .settings import MAX_PULL_BATCH, NatsSettings

log = logging.getLogger("offbroadway.sources.nats")

_ACK, _NAK, _TERM, _WPI = b"+ACK", b"-NAK", b"+TERM", b"+WPI"
_TICK = 0.1               # housekeeping period: idle probes, progress refresh
_IDLE_WINDOW = 2.0        # probe only while exhausted() was asked this recently
_SEND_RETRY = 0.2         # pause before retrying settles that could not be sent
#: JetStream API error codes that retrying cannot fix while nobody changes the server
_STREAM_NOT_FOUND = 10059


class SetupError(Exception):
    """The server answered, but the stream or consumer cannot be used as configured."""


class JetStreamPuller:
    """Runs the asyncio side; every attribute not named "shared" is the I/O thread's."""

    def __init__(self, settings: NatsSettings, mailbox: Mailbox, *, client_name: str) -> None:
        self.s = settings
        #: the window (``prefetch``); a resize may change it while the pull loop runs
        self.prefetch = settings.prefetch
        self.mailbox = mailbox
        self.client_name = client_name
        self.url_masked = mask_url(settings.url)
        # shared: written by the producer thread, read here
        self.commands: deque[IoOp] = deque()
        self.paused = False
        self.idle_asked_at = 0.0
        # shared: written here, read by the producer thread (single assignments)
        self.state = "new"
        self.last_error = ""
        self.empty_confirmed = False
        self.fatal: BaseException | None = None
        self.first_attempt = threading.Event()
        self.closing = threading.Event()
        # I/O thread only
        self.owed: dict[str, float] = {}   # reply subject -> when the server last heard of it
        self._loop: asyncio.AbstractEventLoop | None = None
        self._kick: asyncio.Event | None = None
        self._nc: Any = None
        self._js: Any = None
        self._psub: Any = None
        self._zero_probes = 0
        self._next_refresh = 0.0
        self._thread: threading.Thread | None = None
        # counters
        self.deliveries = self.redelivered = self.acked = self.naked = 0
        #: failed deliveries (a message nak'ed after failing can fail again), and the books
        #: that count messages instead: stream sequence -> failures in this run, of the
        #: messages nak'ed after failing and neither acked nor terminated since
        #: (``terminated`` counts those failed for good)
        self.failures = 0
        self.failing: dict[int, int] = {}
        self.requeued = self.terminated = self.dead_lettered = self.dead_letter_errors = 0
        self.returned = self.stale = self.reconnects = self.progress_sent = 0
        self.oversized = self.pull_errors = 0
        #: acks published and not yet confirmed by a flush; ``acked`` counts them once the
        #: server answered the flush that follows them (it has read them), and the tally
        #: keeps that count (``sent_book``): an ack counted when published, lost with the
        #: process in the client's buffer, would be counted again at its redelivery
        self.acks_unconfirmed = 0
        self.sent_book: SentAcks | None = None

    # -- producer thread -----------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, daemon=True,
                                        name=f"nats-io-{self.client_name}")
        self._thread.start()

    def post(self, op: IoOp) -> None:
        """Hand the I/O thread an operation (:mod:`..io_ops`: ack, fail, requeue, pause,
        resume)."""
        self.commands.append(op)
        self._wake()

    def stop(self, timeout: float) -> bool:
        """Close: give back what was not handed out, flush settles, disconnect.  True if the
        thread ended in time."""
        self.closing.set()
        self._wake()
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def _wake(self) -> None:
        loop, kick = self._loop, self._kick
        if loop is not None and kick is not None:
            with contextlib.suppress(RuntimeError):   # the loop has closed: nothing to wake
                loop.call_soon_threadsafe(kick.set)

    # -- the I/O thread ------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except Exception as exc:     # the thread must report, not die silently
            log.exception("nats source: I/O thread failed")
            self.fatal = self.fatal or exc
            self.state = "failed"
        finally:
            self.first_attempt.set()

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._kick = asyncio.Event()
        if not await self._connect_with_retry():
            return
        tasks = [asyncio.create_task(self._pull_loop()),
                 asyncio.create_task(self._command_loop()),
                 asyncio.create_task(self._housekeeping())]
        try:
            while not self.closing.is_set():
                await asyncio.sleep(0.1)      # the kick belongs to the command loop
                for t in tasks:
                    if t.done() and t.exception() is not None:
                        raise t.exception()   # type: ignore[misc]
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._shutdown()

    async def _wait_kick(self, timeout: float) -> None:
        assert self._kick is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._kick.wait(), timeout)
        self._kick.clear()

    async def _sleep(self, seconds: float) -> None:
        """Sleep that a close cuts short."""
        end = time.monotonic() + seconds
        while not self.closing.is_set() and time.monotonic() < end:
            await asyncio.sleep(min(0.05, max(0.0, end - time.monotonic())))

    async def _connect_with_retry(self) -> bool:
        delay = self.s.backoff_min
        attempt = 0
        while not self.closing.is_set():
            attempt += 1
            try:
                await self._connect()
                return True
            except SetupError as exc:
                self.fatal, self.state, self.last_error = exc, "failed", str(exc)
                return False
            except Exception as exc:
                await self._drop_connection()
                self.state = "reconnecting"
                self.last_error = _describe(exc)
                self.first_attempt.set()    # open() need not wait for an unreachable server
                wait = random.uniform(0, delay)
                log.warning("nats source: %s unreachable (%s); retry %d in %.2fs",
                            self.url_masked, self.last_error, attempt, wait)
                await self._sleep(wait)
                delay = min(delay * 2, self.s.backoff_max)
        return False

    async def _connect(self) -> None:
        s = self.s
        self.state = "connecting"
        self._nc = await nats.connect(
            servers=[s.url], name=f"offbroadway {self.client_name}",
            connect_timeout=s.connect_timeout, allow_reconnect=True,
            max_reconnect_attempts=-1, reconnect_time_wait=s.backoff_min,
            error_cb=self._on_error, disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected, closed_cb=self._on_closed)
        self._js = self._nc.jetstream(timeout=s.connect_timeout)
        await self._ensure_consumer()
        self._psub = await self._js.pull_subscribe_bind(consumer=s.consumer, stream=s.stream)
        self.state = "connected"
        self.first_attempt.set()

    async def _ensure_consumer(self) -> None:
        """Use the durable consumer, creating it if allowed; refuse one that cannot work."""
        s = self.s
        jsm = self._js._jsm
        try:
            info = await jsm.consumer_info(s.stream, s.consumer)
        except nats.js.errors.NotFoundError as exc:
            if exc.err_code == _STREAM_NOT_FOUND:
                raise SetupError(f"stream {s.stream!r} does not exist") from exc
            if not s.create_consumer:
                raise SetupError(f"consumer {s.consumer!r} does not exist on stream "
                                 f"{s.stream!r} (and create_consumer is false)") from exc
            # max_deliver is enforced here (fail() dead-letters, then TERMs), never by
            # the server, which would otherwise stop delivering a message without telling
            # anyone; max_ack_pending likewise: the producers' prefetch bounds the window
            config = api.ConsumerConfig(
                durable_name=s.consumer, ack_policy=api.AckPolicy.EXPLICIT,
                deliver_policy=api.DeliverPolicy.ALL, ack_wait=s.ack_wait, max_deliver=-1,
                max_ack_pending=-1, filter_subject=s.subject)
            try:
                await jsm.add_consumer(s.stream, config=config)
            except nats.js.errors.BadRequestError as exc2:
                # two producers creating it at once: the second finds it made
                with contextlib.suppress(nats.js.errors.NotFoundError):
                    await jsm.consumer_info(s.stream, s.consumer)
                    return
                raise SetupError(f"cannot create consumer {s.consumer!r}: "
                                 f"{exc2.description}") from exc2
            log.info("nats source: created durable consumer %r on stream %r", s.consumer,
                     s.stream)
            return
        cfg = info.config
        if cfg.deliver_subject:
            raise SetupError(f"consumer {s.consumer!r} is a push consumer; this source needs "
                             f"a pull consumer")
        if cfg.ack_policy != api.AckPolicy.EXPLICIT:
            raise SetupError(f"consumer {s.consumer!r} has ack_policy {cfg.ack_policy}; this "
                             f"source needs explicit acks")

    # -- pulling -------------------------------------------------------------------------------
    async def _pull_loop(self) -> None:
        s = self.s
        delay = s.backoff_min
        while not self.closing.is_set():
            room = self.prefetch - len(self.owed)
            if self.paused or room <= 0 or not self._nc.is_connected:
                await self._sleep(0.05)
                continue
            try:
                msgs = await self._psub.fetch(min(room, MAX_PULL_BATCH),
                                              timeout=s.pull_timeout)
            except (TimeoutError, nats.errors.TimeoutError):
                continue          # nothing to pull for pull_timeout: ask again
            except Exception as exc:
                if self.closing.is_set():
                    return
                self.pull_errors += 1
                self.last_error = _describe(exc)
                log.warning("nats source: pull from %s/%s failed (%s); retrying in %.2fs",
                            s.stream, s.consumer, self.last_error, delay)
                await self._sleep(random.uniform(0, delay))
                delay = min(delay * 2, s.backoff_max)
                if isinstance(exc, nats.js.errors.NotFoundError):
                    with contextlib.suppress(Exception):
                        await self._ensure_consumer()
                continue
            delay = s.backoff_min
            self._accept(msgs)

    def _accept(self, msgs: list) -> None:
        now = time.monotonic()
        items: list[Item] = []
        for msg in msgs:
            if not msg.reply:
                continue
            self.owed[msg.reply] = now
            items.append(self._item(msg))
        self.deliveries += len(items)
        self.empty_confirmed = False
        self._zero_probes = 0
        if self.paused or self.closing.is_set():
            self.commands.append(Requeue([h for *_, h in items]))
            self.returned += len(items)
            return
        self.mailbox.put_many(items)

    def _item(self, msg: Any) -> Item:
        item = to_item(msg, self.s.max_message_bytes)
        if item[3].delivered > 1:
            self.redelivered += 1
        if item[1] is None and "body_bytes" in item[2]:
            self.oversized += 1
        return item

    # -- settling ------------------------------------------------------------------------------
    async def _command_loop(self) -> None:
        while not self.closing.is_set():
            await self._run_commands()
            await self._wait_kick(0.2)

    async def _run_commands(self) -> None:
        commands = self.commands
        while commands:
            op = commands.popleft()
            try:
                await self._run_one(op)
            except _Unsent as unsent:
                commands.appendleft(_rest(op, unsent.rest))   # the rest, first, once we can
                await asyncio.sleep(_SEND_RETRY)
                return
        if self.acks_unconfirmed:
            await self._confirm_acks()

    async def _confirm_acks(self) -> None:
        """Count the acks published so far once the server has read them (a flush's
        answer comes after them on the connection).  Not answered: they stay unconfirmed
        (unacked in the books) for the next flush."""
        n = self.acks_unconfirmed
        try:
            await self._nc.flush(timeout=self.s.connect_timeout)
        except Exception as exc:
            self.last_error = _describe(exc)
            return
        self.acks_unconfirmed -= n
        self.acked += n
        if self.sent_book is not None:
            self.sent_book.left(self.acked)

    async def _run_one(self, op: IoOp) -> None:
        match op:
            case Ack(handles):
                await self._settle_each(handles, lambda h: _ACK, "acks_unconfirmed",
                                        forget=self.failing)
            case Requeue(handles):
                await self._settle_each(handles, lambda h: _NAK, "requeued")
            case Fail(failures):
                await self._fail(failures)
            case Pause():
                back = self.mailbox.take_all()
                self.returned += len(back)
                await self._settle_each([h for *_, h in back], lambda h: _NAK, "requeued")
            case Resume():
                pass      # the pull loop reads ``paused``

    async def _settle_each(self, handles: list[NatsHandle], payload: Callable[[Any], bytes],
                           counter: str, forget: dict[int, int] | None = None) -> None:
        """Send ``payload`` for each handle still owed; ``forget``: the failure books, of
        which a message settled so leaves (it failed before, and now it went through)."""
        done = 0
        for i, h in enumerate(handles):
            if h.reply not in self.owed:
                self.stale += 1
                continue
            try:
                await self._nc.publish(h.reply, payload(h))
            except Exception as exc:
                self._add(counter, done)
                self.last_error = _describe(exc)
                raise _Unsent(handles[i:]) from exc
            del self.owed[h.reply]
            if forget:
                forget.pop(h.stream_seq, None)
            done += 1
        self._add(counter, done)

    def _add(self, counter: str, n: int) -> None:
        setattr(self, counter, getattr(self, counter) + n)

    async def _fail(self, failures: list[tuple[NatsHandle, str]]) -> None:
        s = self.s
        delay = json.dumps({"delay": int(s.nak_delay * 1e9)}).encode() if s.nak_delay else b""
        nak = _NAK + b" " + delay if delay else _NAK
        for i, (h, reason) in enumerate(failures):
            if h.reply not in self.owed:
                self.stale += 1
                continue
            try:
                if h.delivered < s.max_deliver:
                    await self._nc.publish(h.reply, nak)
                    self.naked += 1
                    again = True
                else:
                    if s.dead_letter_subject and not await self._dead_letter(h, reason):
                        await self._nc.publish(h.reply, nak)   # kept: try again later
                        self.naked += 1
                        again = True
                    else:
                        await self._nc.publish(h.reply, _TERM)
                        self.terminated += 1
                        again = False
            except Exception as exc:
                self.last_error = _describe(exc)
                raise _Unsent(failures[i:]) from exc
            del self.owed[h.reply]
            self.failures += 1
            if again:
                self.failing[h.stream_seq] = self.failing.get(h.stream_seq, 0) + 1
            else:
                self.failing.pop(h.stream_seq, None)

    async def _dead_letter(self, h: NatsHandle, reason: str) -> bool:
        """Store a copy on the dead-letter subject (a stream must capture it); False if the
        server did not confirm it, and then the original is kept."""
        s = self.s
        try:
            await self._js.publish(s.dead_letter_subject, h.data,
                                   headers=dead_letter_headers(h, reason, s),
                                   timeout=s.connect_timeout)
        except Exception as exc:
            self.dead_letter_errors += 1
            self.last_error = _describe(exc)
            log.error("nats source: dead letter of %s:%d to %r not stored (%s); the message "
                      "is kept and redelivered in %.1fs", s.stream, h.stream_seq,
                      s.dead_letter_subject, self.last_error, s.nak_delay)
            return False
        self.dead_lettered += 1
        return True

    # -- housekeeping --------------------------------------------------------------------------
    async def _housekeeping(self) -> None:
        while not self.closing.is_set():
            await asyncio.sleep(_TICK)
            if not self._nc.is_connected:
                self.empty_confirmed = False
                continue
            now = time.monotonic()
            try:
                if now >= self._next_refresh:
                    self._next_refresh = now + self.s.ack_wait / 6
                    await self._refresh_progress(now)
                await self._probe(now)
            except Exception as exc:
                self.last_error = _describe(exc)
                self.empty_confirmed = False

    async def _refresh_progress(self, now: float) -> None:
        """``+WPI`` for what this source has owed for a third of ``ack_wait``."""
        limit = self.s.ack_wait / 3
        for reply, since in list(self.owed.items()):
            if now - since >= limit and reply in self.owed:
                await self._nc.publish(reply, _WPI)
                self.owed[reply] = now
                self.progress_sent += 1

    async def _probe(self, now: float) -> None:
        """Confirm the consumer is empty: nothing undelivered and nothing ack-pending but
        what this source holds, twice in a row with no delivery in between (one answer can
        overtake a pull already on its way).  Only while ``exhausted()`` is being asked."""
        if now - self.idle_asked_at > _IDLE_WINDOW or self.paused or len(self.mailbox):
            self._zero_probes = 0
            return
        seen = self.deliveries
        info = await self._js._jsm.consumer_info(self.s.stream, self.s.consumer)
        empty = (info.num_pending == 0 and info.num_ack_pending == len(self.owed)
                 and self.deliveries == seen and not self.commands)
        self._zero_probes = self._zero_probes + 1 if empty else 0
        self.empty_confirmed = self._zero_probes >= 2
        if self.empty_confirmed and self.failing:
            self._forget_settled_elsewhere()

    def _forget_settled_elsewhere(self) -> None:
        """The server holds nothing ack-pending but what this source owes, so a message this
        source nak'ed after failing and does not owe now was settled since by another
        consumer of the durable: acked there, or failed for good and counted in that
        consumer's books.  It leaves these books: a message counts as failed once, in the
        books of whoever ended it."""
        try:
            owed = {Msg.Metadata._from_reply(reply).sequence.stream for reply in self.owed}
        except (NotJSMessageError, ValueError, IndexError):
            return      # a reply we cannot read: keep the books as they are
        self.failing = {seq: n for seq, n in self.failing.items() if seq in owed}

    # -- connection events ---------------------------------------------------------------------
    async def _on_error(self, exc: Exception) -> None:
        self.last_error = _describe(exc)
        log.debug("nats source: %s", self.last_error)

    async def _on_disconnected(self) -> None:
        if not self.closing.is_set():
            self.state = "reconnecting"
            self.empty_confirmed = False
            log.warning("nats source: disconnected from %s (%s); reconnecting, %d owed "
                        "messages stay owed", self.url_masked, self.last_error or "closed",
                        len(self.owed))

    async def _on_reconnected(self) -> None:
        self.reconnects += 1
        self.state = "connected"
        log.warning("nats source: reconnected to %s", self.url_masked)

    async def _on_closed(self) -> None:
        if not self.closing.is_set():
            self.state = "disconnected"

    async def _shutdown(self) -> None:
        """Give back what the producer never took, flush every settle, close."""
        nc = self._nc
        if nc is None:
            return
        back = self.mailbox.take_all()
        if back:
            self.returned += len(back)
            self.commands.append(Requeue([h for *_, h in back]))
        with contextlib.suppress(Exception):
            if nc.is_connected:
                await asyncio.wait_for(self._run_commands(), self.s.connect_timeout)
                await nc.flush(timeout=self.s.connect_timeout)
        await self._drop_connection()
        self.state = "closed"

    async def _drop_connection(self) -> None:
        nc, self._nc, self._psub = self._nc, None, None
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.close()


class _Unsent(Exception):
    """Settles that could not be published; ``rest`` goes back to the front of the queue."""

    def __init__(self, rest: list) -> None:
        super().__init__(f"{len(rest)} settles not sent")
        self.rest = rest


def _rest(op: IoOp, rest: list) -> IoOp:
    """``op`` again over the settles of it that could not be sent."""
    match op:
        case Ack():
            return Ack(rest)
        case Requeue():
            return Requeue(rest)
        case Fail():
            return Fail(rest)
    # a pause runs again and gives back what the mailbox holds then; the NAKs of its first
    # run that could not be sent are not among them: they stay owed (as before the records)
    return op


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, nats.js.errors.APIError) and exc.description:
        text = f"{exc.description} (code {exc.code}, err_code {exc.err_code})"
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text
