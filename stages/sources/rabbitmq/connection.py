"""The ``rabbitmq`` source's I/O thread: connect, consume, reconnect, run the producer's
commands.

Why a thread.  The producer's loop is a single-threaded ``zmq.Poller`` and wants one fd
that is readable "when messages wait".  The AMQP socket itself is a poor fd for that: it
changes on every reconnect (the producer registers the fd once), it stays readable while
the producer has no demand (a level-triggered poller then spins), and heartbeats must be
answered even while the producer is busy or has no demand for a minute.  So one I/O thread
owns the pika ``BlockingConnection`` (pika's only thread-safe entry is
``add_callback_threadsafe``, which is how :meth:`Consumer.wake` wakes it), deliveries go
to the producer through a :class:`~..mailbox.Mailbox`, and the producer's settlements come
back as commands this thread runs (:mod:`.settle`).

A broker that is unreachable, or closes the connection before the AMQP handshake, is
retried with jittered backoff (tenacity); one that refuses
the configuration (unknown queue, access refused) is fatal at the first attempt, and
retried once the source has run, so an operator can recreate a deleted queue without
restarting the daemon.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections import deque
from typing import Any

import pika
import pika.exceptions as amqp_errors
import tenacity

from ...runtime.redact import describe_error, mask_url
from ..base import Item, backoff_wait, next_attempt
from ..io_ops import Ack, Fail, IoOp, Pause, Reconcile, Requeue, Resume, Window
from ..mailbox import Mailbox
from .delivery import item_of, to_item
from .frames import install as install_frames
from .probe import IdleProbe
from .settings import RabbitMQSettings
from .settle import Settlement

log = logging.getLogger("offbroadway.sources.rabbitmq")
# pika logs a failed connection attempt as seven ERROR lines and a traceback (and each open
# and close at INFO): this source logs one line per attempt with the cause and the next
# attempt's time instead; a level the user configured is left alone.
if logging.getLogger("pika").level == logging.NOTSET:
    logging.getLogger("pika").setLevel(logging.CRITICAL)

# AMQP reply codes retrying cannot fix while nobody changes the broker: access refused, not
# found, precondition failed, not allowed (vhost).  Fatal at open(); later, retried.
_PERMANENT_CODES = frozenset({403, 404, 406, 530})


class ConsumerCancelled(Exception):
    """The broker cancelled our consumer (queue deleted, node down): reconnect."""


def is_permanent(exc: BaseException) -> bool:
    # not pika's IncompatibleProtocolError: its name for any close before the handshake
    if isinstance(exc, (amqp_errors.ProbableAuthenticationError,
                        amqp_errors.ProbableAccessDeniedError,
                        amqp_errors.AuthenticationError)):
        return True
    if isinstance(exc, (amqp_errors.ChannelClosedByBroker,
                        amqp_errors.ConnectionClosedByBroker)):
        return exc.reply_code in _PERMANENT_CODES
    return False


class Consumer:
    """The I/O thread's side of one source.  Attributes the producer thread reads
    (``state``, ``last_error``, counters) are single assignments; the command queue is a
    ``deque`` (thread-safe appends and pops)."""

    def __init__(self, settings: RabbitMQSettings, *, session: str, pipeline: str,
                 producer_index: int) -> None:
        self.settings = settings
        self._queue, self._max_bytes = settings.queue, settings.max_message_bytes
        self.url_masked = mask_url(settings.url)
        self._session = session
        self._connection_name = f"offbroadway {pipeline} producer_{producer_index}"
        self._thread_name = f"rabbitmq-io-{producer_index}"
        self.mailbox: Mailbox | None = None     # set by start()
        self.settle = Settlement(settings.on_failure)
        self.probe = IdleProbe()
        # producer thread → I/O thread
        self.commands: deque[IoOp] = deque()
        self._wake_pending = False
        self.paused = False
        #: requeues asked (producer thread) and taken over by the I/O thread: while they
        #: differ, the probe's "empty" predates messages on their way back to the queue
        self.requeues_asked = self.requeues_taken = 0
        # I/O thread only
        self._conn: pika.BlockingConnection | None = None
        self._channel: Any = None
        self._probe_channel: Any = None
        self._consumer_tag: str | None = None
        self._consuming = False
        self._broker_cancelled = False
        #: deliveries of the current pass of pika's loop, handed to the producer together
        #: when the pass ends (:meth:`_hand_over`): one lock and at most one wake-up per
        #: pass, where one per delivery cost the producer a wake-up per message
        self._pass: list[Item] = []
        # set by the I/O thread, read by the producer thread
        self.incarnation = 0
        self.state = "new"
        self.last_error = ""
        self.closing = threading.Event()
        self.first_attempt = threading.Event()
        self.fatal: BaseException | None = None
        self._opened_once = False
        self._thread: threading.Thread | None = None
        self.deliveries = self.redelivered = self.returned = 0
        self.dropped_on_loss = self.reconnects = self.oversized = 0
        #: why the broker took back what this connection held, for the producer
        #: (:meth:`RabbitMQSource.taken_back`); appended here, popped there
        self.losses: deque[str] = deque()

    # -- producer thread ---------------------------------------------------------------------
    def start(self, mailbox: Mailbox) -> None:
        """Start the thread and wait for its first connection attempt."""
        self.mailbox = mailbox
        self._thread = threading.Thread(target=self._main, daemon=True,
                                        name=self._thread_name)
        self._thread.start()
        self.first_attempt.wait(self.settings.connect_timeout + 5.0)

    def stop(self) -> bool:
        """Flush what is owed to the broker and close; False if the thread lingers."""
        thread = self._thread
        if thread is None:
            return True
        self.closing.set()
        self.wake()
        thread.join(self.settings.connect_timeout + 5.0)
        self._thread = None
        return not thread.is_alive()

    def command(self, op: IoOp) -> None:
        self.commands.append(op)
        if not self._wake_pending:
            self._wake_pending = True
            self.wake()

    def wake(self) -> None:
        conn = self._conn
        if conn is None:
            return       # the I/O loop runs the commands when it is connected again
        with contextlib.suppress(amqp_errors.AMQPError, OSError):
            # closed or closing: the I/O loop notices on its own and runs the commands
            conn.add_callback_threadsafe(_noop)

    # -- the thread ----------------------------------------------------------------------------
    def _main(self) -> None:
        retrying = tenacity.Retrying(
            sleep=self.closing.wait,
            stop=lambda _state: self.closing.is_set(),
            wait=backoff_wait(self.settings.backoff_min, self.settings.backoff_max),
            retry=tenacity.retry_if_exception(self._should_retry),
            before_sleep=self._before_retry,
            reraise=True)
        try:
            while not self.closing.is_set():
                try:
                    retrying(self._connect)
                except Exception as exc:
                    if not self.closing.is_set():
                        self.fatal = exc
                        self.state = "failed"
                        self.last_error = describe_error(exc, self.settings.url)
                    break
                finally:
                    self.first_attempt.set()
                try:
                    self._serve()
                except Exception as exc:    # the thread must outlive any error
                    if self.closing.is_set():
                        break
                    if not isinstance(exc, (amqp_errors.AMQPError, OSError,
                                            ConsumerCancelled)):
                        log.exception("rabbitmq source: unexpected error in the I/O loop")
                    self._lost(exc)
        finally:
            self._shutdown_connection()
            self.first_attempt.set()

    def _should_retry(self, exc: BaseException) -> bool:
        if self.closing.is_set():
            return False
        return self._opened_once or not is_permanent(exc)

    def _before_retry(self, retry_state: tenacity.RetryCallState) -> None:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        self.state = "reconnecting"
        self.last_error = describe_error(exc, self.settings.url) if exc else ""
        self.first_attempt.set()      # open() need not wait for an unreachable broker
        delay = retry_state.next_action.sleep if retry_state.next_action else 0.0
        log.warning("rabbitmq source: %s unreachable (%s); attempt %d failed, next in %s",
                    self.url_masked, self.last_error, retry_state.attempt_number,
                    next_attempt(delay))

    def _connect(self) -> None:
        s = self.settings
        self.state = "connecting"
        params = pika.URLParameters(s.url)
        params.heartbeat = s.heartbeat
        params.socket_timeout = s.connect_timeout
        params.stack_timeout = s.connect_timeout * 3
        params.blocked_connection_timeout = max(60.0, s.heartbeat * 2.0)
        params.connection_attempts = 1      # tenacity does the retrying, with jitter
        params.client_properties = {"connection_name": self._connection_name}
        conn = pika.BlockingConnection(params)
        try:
            channel = conn.channel()
            if s.declare:
                channel.queue_declare(s.queue, durable=s.durable, auto_delete=s.auto_delete,
                                      arguments=s.queue_arguments or None)
            else:
                channel.queue_declare(s.queue, passive=True)   # a clear 404 if missing
            for exchange, routing_key, arguments in s.bindings:
                channel.queue_bind(s.queue, exchange, routing_key, arguments or None)
            channel.basic_qos(prefetch_count=s.prefetch_count)
            channel.add_on_cancel_callback(self._on_broker_cancel)
        except BaseException:
            _close_quietly(conn)
            raise
        self.incarnation += 1
        self._conn, self._channel, self._probe_channel = conn, channel, None
        # deliveries on this channel are parsed by .frames, everything else by pika
        install_frames(conn, channel.channel_number, self._on_frames_delivery)
        self.settle.attach(channel, self.incarnation)
        self._consuming = False
        self._broker_cancelled = False
        self.probe.delivered()
        if self._opened_once:
            self.reconnects += 1
            log.warning("rabbitmq source: reconnected to %s (incarnation %d)",
                        self.url_masked, self.incarnation)
        elif self.last_error:
            log.warning("rabbitmq source: connected to %s (it was unreachable: %s)",
                        self.url_masked, self.last_error)
        self._opened_once = True
        self.state = "connected"
        if not self.paused:
            self._start_consuming()
        self._wake_pending = False    # wakes posted while disconnected went nowhere

    def _start_consuming(self) -> None:
        if not self._consuming:
            self._consumer_tag = self._channel.basic_consume(
                self.settings.queue, self._on_delivery, auto_ack=False)
            self._consuming = True

    def _stop_consuming(self) -> None:
        """basic.cancel; pika rejects (requeue) what arrived but was not dispatched yet,
        and what the producer did not fetch goes back too."""
        if self._consuming and self._consumer_tag is not None:
            self._channel.basic_cancel(self._consumer_tag)
        self._consuming = False
        assert self.mailbox is not None
        back = self.mailbox.take_all() + self._pass
        self._pass = []
        self.returned += self.settle.give_back([item[3] for item in back])

    def _serve(self) -> None:
        conn, mailbox = self._conn, self.mailbox
        assert conn is not None and mailbox is not None
        while not self.closing.is_set():
            self._run_commands()
            if self._broker_cancelled:
                raise ConsumerCancelled("the broker cancelled the consumer (queue deleted?)")
            if not self._channel.is_open:
                raise amqp_errors.ChannelClosed(0, "the consuming channel closed")
            now = time.monotonic()
            timeout = 0.005 if mailbox.woken else 0.2
            settle = self.settle
            if settle.owed:
                timeout = max(0.0, min(timeout, settle.send_acks(now)))
                if settle.cooling:
                    timeout = min(timeout, settle.release_cooling(now))
            mailbox.tend(now)
            # requeues the broker has not been told of (they go in bulk) are messages
            # the queue will have again: no probe may call it empty before
            if self.probe.due(now, paused=self.paused,
                              buffered=len(mailbox) + len(self.settle.requeue_owed)):
                self._probe()
            conn.process_data_events(time_limit=timeout)
            self._hand_over()
        self._run_commands()
        self.settle.release_cooling(all_=True)
        self.settle.send_acks(force=True)

    def _hand_over(self) -> None:
        """The pass's deliveries to the producer, in one go."""
        if self._pass:
            batch, self._pass = self._pass, []
            self.mailbox.put_many(batch)     # type: ignore[union-attr]

    def _lost(self, exc: BaseException) -> None:
        """The connection died: everything it held is the broker's to redeliver."""
        assert self.mailbox is not None
        dropped = len(self.mailbox.take_all()) + len(self._pass)
        self._pass = []
        self.dropped_on_loss += dropped
        # delivered and not settled at the broker: it delivers them again, while copies
        # of some are on their way downstream (the producer says so: ``taken_back``)
        held = bool(self.settle.open_tags or self.settle.unsent)
        self.settle.detach()          # acks not sent: the broker redelivers (at-least-once)
        self.probe.delivered()
        conn, self._conn, self._channel, self._probe_channel = self._conn, None, None, None
        self._consuming = False
        if conn is not None:
            _close_quietly(conn)
        self.state = "reconnecting"
        self.last_error = describe_error(exc, self.settings.url)
        if held:
            self.losses.append(f"connection lost: {self.last_error}")
        log.warning("rabbitmq source: connection to %s lost (%s); %d buffered deliveries "
                    "left to the broker, reconnecting", self.url_masked, self.last_error,
                    dropped)

    def _shutdown_connection(self) -> None:
        conn = self._conn
        self._conn = None
        if conn is None:
            return
        try:
            if conn.is_open:
                self._run_commands()
                if self._channel is not None and self._channel.is_open:
                    self.settle.release_cooling(all_=True)
                    self.settle.send_acks(force=True)
                    self._stop_consuming()
                conn.close()
        except (amqp_errors.AMQPError, OSError) as exc:
            log.debug("rabbitmq source: closing: %s", describe_error(exc, self.settings.url))
            _close_quietly(conn)

    # -- deliveries and commands ---------------------------------------------------------------
    def _on_delivery(self, _channel: Any, method: Any, props: Any, body: bytes) -> None:
        # per message, so kept lean: positional calls, and the probe touched only while it
        # is counting (a delivery resets it)
        item = to_item(method, props, body, self._queue, self.incarnation, self._session,
                       self._max_bytes)
        if item[1] is None:          # pika's body is bytes: None is to_item's oversized
            self.oversized += 1
        self.settle.delivered(method.delivery_tag)
        self.deliveries += 1
        if method.redelivered:
            self.redelivered += 1
            self.settle.redelivered_open.add(method.delivery_tag)
        probe = self.probe
        if probe.zero_probes or probe.empty_confirmed:
            probe.delivered()
        elif probe.failing_probes and item[3].key not in self.settle.failing:
            probe.delivered()        # a message that has not failed: not only failures left
        self._pass.append(item)

    def _on_frames_delivery(self, tag: int, redelivered: bool, exchange: Any,
                            routing_key: Any, props: Any, body: bytes) -> None:
        """A delivery :mod:`.frames` parsed: as :meth:`_on_delivery`, without pika's
        objects (``props`` is ``None`` when the publisher set no property)."""
        item = item_of(tag, redelivered, exchange, routing_key, props, body, self._queue,
                       self.incarnation, self._session, self._max_bytes)
        if item[1] is None:
            self.oversized += 1
        self.settle.delivered(tag)
        self.deliveries += 1
        if redelivered:
            self.redelivered += 1
            self.settle.redelivered_open.add(tag)
        probe = self.probe
        if probe.zero_probes or probe.empty_confirmed:
            probe.delivered()
        elif probe.failing_probes and item[3].key not in self.settle.failing:
            probe.delivered()
        self._pass.append(item)

    def _on_broker_cancel(self, _frame: Any) -> None:
        self._broker_cancelled = True

    def _run_commands(self) -> None:
        self._wake_pending = False
        commands, settle = self.commands, self.settle
        while commands:
            match commands.popleft():
                case Ack(handles):
                    settle.ack(handles)
                case Fail(failures):
                    settle.fail(failures)
                case Reconcile(settled, moved):
                    settle.reconcile(settled, moved)
                case Requeue(handles):
                    try:
                        settle.requeue(handles)
                    finally:
                        # on their way back to the queue: an "empty" confirmed before says
                        # nothing now, and no probe counts until the broker has been told
                        # (_serve).  Reset, then counted: the producer thread reads in
                        # that order.  Counted even if the channel died under it, or
                        # exhausted() would wait for it forever (a lost connection resets
                        # the probe too)
                        self.probe.delivered()
                        self.requeues_taken += 1
                case Pause() if self._channel is not None and self.paused:
                    # the stop's drain or the operator's pause: back to the queue
                    settle.release_cooling(all_=True)
                    self._stop_consuming()
                case Resume() if self._channel is not None and not self.paused:
                    self._start_consuming()
                case Window(prefetch):
                    self.settings = dataclasses.replace(self.settings,
                                                        prefetch_count=prefetch)
                    if self._channel is not None:
                        self._channel.basic_qos(prefetch_count=prefetch)
                    log.info("rabbitmq source: prefetch %d auto (the pipeline was resized)",
                             prefetch)

    def _probe(self) -> None:
        """A passive queue.declare on a channel of its own (see :mod:`.probe`)."""
        conn = self._conn
        if conn is None:
            return
        if self._probe_channel is None or not self._probe_channel.is_open:
            self._probe_channel = conn.channel()
        seen = self.deliveries
        try:
            frame = self._probe_channel.queue_declare(self.settings.queue, passive=True)
        except amqp_errors.ChannelClosedByBroker as exc:
            self._probe_channel = None
            self.probe.failed()
            self.last_error = describe_error(exc, self.settings.url)
            return
        # deliveries that arrived during the RPC are queued inside pika: dispatch them
        # before deciding, so a delivery overtaken by the probe's answer still counts
        conn.process_data_events(time_limit=0)
        self._hand_over()
        ready = frame.method.message_count
        self.probe.answered(ready, delivered_meanwhile=self.deliveries != seen,
                            only_failures=self.settle.only_failures_left(ready))


def _noop() -> None:
    """Posted through add_callback_threadsafe only to wake the I/O loop."""


def _close_quietly(conn: pika.BlockingConnection) -> None:
    with contextlib.suppress(amqp_errors.AMQPError, OSError):
        if conn.is_open:
            conn.close()
