"""The ``rabbitmq`` source: a consumer on one RabbitMQ queue (AMQP 0-9-1, through pika).

RabbitMQ pushes (seed 001): once subscribed, the broker sends up to ``prefetch_count``
unacknowledged deliveries and then waits for acks.  So, like BroadwayRabbitMQ, this source
ignores demand on the broker side and lets the prefetch window be the back-pressure: the
deliveries are buffered here (never more than the window) and handed to the producer as
its consumers ask (:meth:`RabbitMQSource.fetch`).

Why a thread.  The producer's loop is a single-threaded ``zmq.Poller`` and wants one fd
that is readable "when messages wait".  The AMQP socket itself is a poor fd for that: it
changes on every reconnect (the producer registers the fd once), it stays readable while
the producer has no demand (a level-triggered poller then spins), and heartbeats must be
answered even while the producer is busy or has no demand for a minute.  So one I/O thread
owns the pika ``BlockingConnection`` (pika's only thread-safe entry is
``add_callback_threadsafe``, which is how the producer thread wakes it) and an eventfd,
created once, is what :meth:`fileno` returns.  The eventfd is written only when the
producer is known to want more (its last fetch came back short), so a producer with no
demand is never woken in a loop; a wake-up the producer did not consume (it had no demand
after all) is withdrawn after a few milliseconds and offered again with a growing delay.

Acknowledgement rules: a handle names the connection incarnation it came from; after a
connection loss the broker requeues everything that connection held, so handles of a dead
incarnation are dropped (counted as ``stale``), never acked on the new channel where the
same delivery tag means another message.  Each delivery tag is settled at most once.

Acks go out as ``multiple`` acks, one per I/O pass: every ack the producer sent since the
last pass is collected, and the broker is told "up to tag T" for the longest run of
settled tags at the front of the delivery order.  A settled tag behind one still open
(two processors finish their frames in either order) waits for the front to reach it;
when the front has not moved for ``_ACK_DELAY``, what waits behind it is acked tag by tag,
so a long job at the front never holds the others' acks (nor their prefetch slots) for
long.  Each ack is a frame and, through
pika's ``BlockingChannel``, a flush with a poll of the socket: one per message was most of
this source's cost at a few thousand messages a second.

Failure policies (``on_failure``): ``reject`` (basic.reject requeue=false: the queue's
dead-letter exchange gets it, or the broker drops it if there is none), ``requeue``, and
``reject_and_requeue_once`` (requeue a first delivery, reject a redelivered one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import pika
import pika.exceptions as amqp_errors
import tenacity

from ..redact import describe_error, mask_url
from .base import (
    DEFAULT_MAX_MESSAGE_BYTES,
    Failure,
    Item,
    Source,
    backoff_wait,
    next_attempt,
    option_float,
    option_int,
    option_max_message_bytes,
    option_str,
    oversized,
)

log = logging.getLogger("offbroadway.sources.rabbitmq")
# pika logs every connection open and close at INFO, several lines each, and a failed
# connection attempt as seven ERROR lines and a traceback: with one connection per producer
# and a retry every few seconds that drowns the daemon's own log.  This source logs one
# line per attempt with the cause and the next attempt's time instead, and keeps the last
# error in its stats; a level the user configured is left alone.
if logging.getLogger("pika").level == logging.NOTSET:
    logging.getLogger("pika").setLevel(logging.CRITICAL)

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
#: used when ``prefetch_count = "auto"`` and the daemon did not compute ``auto_prefetch``
DEFAULT_PREFETCH = 50
ON_FAILURE = ("reject", "requeue", "reject_and_requeue_once")
ON_SUCCESS = ("ack",)

# AMQP reply codes that retrying cannot fix while nobody changes the broker: access refused,
# not found (queue or exchange), precondition failed (declared with other arguments), and
# not allowed (vhost).  Fatal at open(); once the source has run, retried with backoff, so
# an operator can recreate a deleted queue without restarting the daemon.
_PERMANENT_CODES = frozenset({403, 404, 406, 530})
_BASIC_PROPERTIES = ("content_type", "content_encoding", "delivery_mode", "priority",
                     "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
                     "type", "user_id", "app_id", "cluster_id")
_PROPERTY_NAMES = frozenset(_BASIC_PROPERTIES) | {"headers"}
_PLAIN = frozenset({str, bytes, bool, int, float})
# How long a wake-up may sit unconsumed before it is withdrawn, and the longest pause
# before offering it again (see the module docstring).
_WAKE_LEASE = 0.02
_WAKE_RETRY_MAX = 0.5
# The idle probe (passive queue.declare) interval while the producer asks exhausted()
_PROBE_INTERVAL = 0.1
# The longest an ack behind a still-open tag waits for a multiple ack to cover it
_ACK_DELAY = 0.05


class RabbitMQHandle(NamedTuple):
    """What the producer keeps per message: enough to settle it on the right channel."""

    incarnation: int
    tag: int
    redelivered: bool


class _ConsumerCancelled(Exception):
    """The broker cancelled our consumer (queue deleted, node down): reconnect."""


@dataclass(frozen=True)
class RabbitMQSettings:
    """The validated options (see ``docs/sources.md``)."""

    url: str = DEFAULT_URL
    queue: str = ""
    declare: bool = False
    durable: bool = True
    auto_delete: bool = False
    queue_arguments: dict = field(default_factory=dict)
    bindings: tuple[tuple[str, str, dict], ...] = ()
    prefetch_count: int = DEFAULT_PREFETCH
    prefetch_auto: bool = True
    on_success: str = "ack"
    on_failure: str = "reject"
    heartbeat: int = 30
    connect_timeout: float = 5.0
    backoff_min: float = 0.1
    backoff_max: float = 10.0
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES


def parse_options(options: Mapping[str, Any]) -> RabbitMQSettings:
    """Validate every option, raising ``ValueError`` that names the offending key."""
    name = RabbitMQSource.name
    url = option_str(name, options, "url", DEFAULT_URL) or DEFAULT_URL
    if urlsplit(url).scheme not in ("amqp", "amqps"):
        raise ValueError(f"{name} source: option 'url' must be an amqp:// or amqps:// URL, "
                         f"got {mask_url(url)!r}")
    queue = option_str(name, options, "queue", None, required=True) or ""

    declare_opt = options.get("declare", False)
    declare, durable, auto_delete, arguments = False, True, False, {}
    if isinstance(declare_opt, bool):
        declare = declare_opt
    elif isinstance(declare_opt, Mapping):
        declare = True
        arguments = dict(declare_opt)
        for flag in ("durable", "auto_delete"):
            if flag in arguments and not isinstance(arguments[flag], bool):
                raise ValueError(f"{name} source: option 'declare.{flag}' must be true or "
                                 f"false, got {arguments[flag]!r}")
        durable = arguments.pop("durable", True)
        auto_delete = arguments.pop("auto_delete", False)
    else:
        raise ValueError(
            f"{name} source: option 'declare' must be true, false or a table of queue "
            f"arguments, got {declare_opt!r}")

    bindings: list[tuple[str, str, dict]] = []
    raw_bindings = options.get("bindings", [])
    if not isinstance(raw_bindings, (list, tuple)):
        raise ValueError(
            f"{name} source: option 'bindings' must be a list of tables "
            f"{{exchange, routing_key, arguments}}, got {raw_bindings!r}")
    for i, b in enumerate(raw_bindings):
        if not isinstance(b, Mapping) or not isinstance(b.get("exchange"), str) \
                or not b["exchange"]:
            raise ValueError(f"{name} source: option 'bindings[{i}]' must be a table with a "
                             f"non-empty 'exchange', got {b!r}")
        unknown = set(b) - {"exchange", "routing_key", "arguments"}
        if unknown:
            raise ValueError(f"{name} source: option 'bindings[{i}]' has unknown key "
                             f"{min(unknown)!r} (known: exchange, routing_key, "
                             f"arguments)")
        rk, args = b.get("routing_key", ""), b.get("arguments", {})
        if not isinstance(rk, str) or not isinstance(args, Mapping):
            raise ValueError(
                f"{name} source: option 'bindings[{i}]': routing_key must be a string and "
                f"arguments a table")
        bindings.append((b["exchange"], rk, dict(args)))

    prefetch_opt = options.get("prefetch_count", "auto")
    auto_value = option_int(name, options, "auto_prefetch", None, minimum=1)
    if prefetch_opt == "auto":
        prefetch, auto = auto_value or DEFAULT_PREFETCH, True
    elif isinstance(prefetch_opt, int) and not isinstance(prefetch_opt, bool):
        if not 1 <= prefetch_opt <= 65535:
            raise ValueError(f"{name} source: option 'prefetch_count' must be between 1 and "
                             f"65535 (0 would mean unlimited: every message in the queue "
                             f"buffered in one producer), got {prefetch_opt}")
        prefetch, auto = prefetch_opt, False
    else:
        raise ValueError(f"{name} source: option 'prefetch_count' must be \"auto\" or an "
                         f"integer, got {prefetch_opt!r}")

    on_success = options.get("on_success", "ack")
    if on_success not in ON_SUCCESS:
        raise ValueError(f"{name} source: option 'on_success' must be one of "
                         f"{', '.join(ON_SUCCESS)}, got {on_success!r}")
    on_failure = options.get("on_failure", "reject")
    if on_failure not in ON_FAILURE:
        raise ValueError(f"{name} source: option 'on_failure' must be one of "
                         f"{', '.join(ON_FAILURE)}, got {on_failure!r}")
    heartbeat = option_int(name, options, "heartbeat", 30, minimum=0)
    backoff_min = option_float(name, options, "backoff_min", 0.1, minimum=0.001)
    backoff_max = option_float(name, options, "backoff_max", 10.0, minimum=backoff_min)
    return RabbitMQSettings(
        url=url, queue=queue, declare=declare, durable=durable, auto_delete=auto_delete,
        queue_arguments=arguments, bindings=tuple(bindings), prefetch_count=prefetch,
        prefetch_auto=auto, on_success=on_success, on_failure=on_failure,
        heartbeat=30 if heartbeat is None else heartbeat,
        connect_timeout=option_float(name, options, "connect_timeout", 5.0, minimum=0.1),
        backoff_min=backoff_min, backoff_max=backoff_max,
        max_message_bytes=option_max_message_bytes(name, options))


def packable(value: Any) -> Any:
    """AMQP table values as msgpack can carry them (pika decodes some to Python types)."""
    if value is None or isinstance(value, (str, bytes, bool, int, float)):
        return value
    if isinstance(value, Mapping):
        return {str(k): packable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [packable(v) for v in value]
    if isinstance(value, datetime):
        # AMQP timestamps are whole seconds since the epoch; pika gives naive UTC datetimes
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return int(value.timestamp())
    if isinstance(value, (Decimal, date)):
        return str(value)
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return str(value)


def _is_permanent(exc: BaseException) -> bool:
    if isinstance(exc, (amqp_errors.ProbableAuthenticationError,
                        amqp_errors.ProbableAccessDeniedError,
                        amqp_errors.AuthenticationError,
                        amqp_errors.IncompatibleProtocolError)):
        return True
    if isinstance(exc, (amqp_errors.ChannelClosedByBroker,
                        amqp_errors.ConnectionClosedByBroker)):
        return exc.reply_code in _PERMANENT_CODES
    return False


def _failed_to(on_failure: str, queue: str) -> str:
    """Where a failed message goes, in the words of the summary line."""
    if on_failure == "requeue":
        return f"requeued to queue {queue!r} (on_failure = requeue)"
    once = "requeued once, then " if on_failure == "reject_and_requeue_once" else ""
    return (f"{once}rejected: to the dead-letter exchange of queue {queue!r} if it has one, "
            f"else dropped by the broker")


def _describe(exc: BaseException, url: str = "") -> str:
    return describe_error(exc, url)


class RabbitMQSource(Source):
    """Consumes one queue; deliveries are buffered (bounded by the prefetch window) and
    handed out by :meth:`fetch`; the producer polls :meth:`fileno`.

    Message id: the AMQP ``message_id`` property when the publisher set one (so duplicates
    after a redelivery can be recognised downstream), else ``"<delivery tag>@<connection>"``
    which is unique per delivery.  ``message.data`` is the body (bytes); ``metadata`` has
    ``routing_key``, ``exchange``, ``delivery_tag``, ``redelivered``, ``queue``, ``headers``
    and every AMQP property that is set.
    """

    name = "rabbitmq"
    known_options = frozenset({
        "url", "queue", "declare", "bindings", "prefetch_count", "auto_prefetch",
        "on_success", "on_failure", "heartbeat", "connect_timeout", "backoff_min",
        "backoff_max", "max_message_bytes"})

    def __init__(self, options: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(options, **kwargs)
        self.settings = parse_options(self.options)
        s = self.settings
        self.url_masked = mask_url(s.url)
        self._queue, self._max_bytes = s.queue, s.max_message_bytes   # read per delivery
        # unique per process and connection incarnation, for message ids without message_id
        self._session = (f"{socket.gethostname()}.{os.getpid()}.{self.producer_index}."
                         f"{time.time_ns() // 1_000_000 % 10**10:x}")
        # shared between the producer thread and the I/O thread, under _lock
        self._lock = threading.Lock()
        self._ready: deque[Item] = deque()
        self._want_wake = False       # the producer's last fetch came back short
        self._woken = False           # the eventfd holds an unconsumed wake-up
        self._woken_at = 0.0
        self._wake_retry = _WAKE_LEASE
        self._rewake_at = 0.0
        self._paused = False
        self._incarnation = 0
        # producer thread → I/O thread
        self._commands: deque[tuple[str, Any]] = deque()
        self._wake_pending = False
        # I/O thread only
        self._conn: pika.BlockingConnection | None = None
        self._channel: Any = None
        self._probe_channel: Any = None
        self._consumer_tag: str | None = None
        self._consuming = False
        self._broker_cancelled = False
        self._open_tags: set[int] = set()        # delivered on this incarnation, unsettled
        self._tag_order: deque[int] = deque()    # delivery order, settled ones lazily removed
        self._unsent_acks: set[int] = set()      # settled ok, the broker not told yet
        self._unsent_since = 0.0                 # when the oldest of those was settled
        self._next_probe = 0.0
        self._zero_probes = 0
        # set by either thread, read by the other (single assignments)
        self._idle_asked_at = 0.0
        self._empty_confirmed = False
        self._state = "new"
        self._last_error = ""
        self._closing = threading.Event()
        self._first_attempt = threading.Event()
        self._fatal: BaseException | None = None
        self._opened_once = False
        self._thread: threading.Thread | None = None
        self._efd = -1
        # counters
        self.deliveries = 0
        self.fetched = self.acked = self.failed = self.rejected = 0
        self.requeued = self.failure_requeued = self.redelivered = 0
        self.stale = self.dropped_on_loss = self.reconnects = self.returned = 0
        self.oversized = 0
        self.ack_frames = 0           # basic.ack frames sent (multiple or single)

    @classmethod
    def preflight(cls, options: Mapping[str, Any]) -> list[str]:
        url = mask_url(str(options.get("url", DEFAULT_URL)))
        return [f"RabbitMQ at {url} is not contacted by check: whether it is reachable, and "
                f"the stream/queue usable, shows only when the daemon runs"]

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        super().validate_options(options)
        parse_options(options)

    # -- lifecycle ----------------------------------------------------------------------------
    def open(self) -> None:
        """Start the I/O thread and wait for its first connection attempt.

        A configuration error the broker reports (unknown queue, access refused, wrong
        credentials) raises here, so a bad config fails at start with the broker's words.
        A broker that is merely unreachable does not: the source keeps retrying with
        backoff and ``stats()`` shows ``state = "reconnecting"``.
        """
        if self._thread is not None:
            return
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._thread = threading.Thread(target=self._io_main, daemon=True,
                                        name=f"rabbitmq-io-{self.producer_index}")
        self._thread.start()
        self._first_attempt.wait(self.settings.connect_timeout + 5.0)
        if self._fatal is not None:
            self._closing.set()
            self._thread.join(5.0)
            self._thread = None
            os.close(self._efd)
            self._efd = -1
            raise RuntimeError(f"rabbitmq source: cannot consume queue "
                               f"{self.settings.queue!r} at {self.url_masked}: "
                               f"{_describe(self._fatal, self.settings.url)}") from self._fatal
        s = self.settings
        if s.prefetch_auto and "auto_prefetch" not in self.options:
            log.warning("rabbitmq source: prefetch_count is \"auto\" but the daemon passed no "
                        "auto_prefetch; using %d, which starves processors if processors x "
                        "max_demand (+ what batchers hold) is larger", DEFAULT_PREFETCH)
        log.info("rabbitmq source: queue %r at %s (prefetch %d%s, on_failure %s): %s",
                 s.queue, self.url_masked, s.prefetch_count,
                 " auto" if s.prefetch_auto else "", s.on_failure, self._state)

    def close(self) -> None:
        """Flush pending acks, hand unfetched deliveries back, close the connection.

        Whatever was fetched and not settled stays unacked and the broker redelivers it
        when the connection closes (at-least-once).
        """
        thread = self._thread
        if thread is None:
            return
        self._closing.set()
        self._wake()
        thread.join(self.settings.connect_timeout + 5.0)
        if thread.is_alive():
            log.warning("rabbitmq source: I/O thread did not stop in time")
        self._thread = None
        with self._lock:        # an I/O thread that outlived the join must not write to it
            fd, self._efd = self._efd, -1
        if fd >= 0:
            os.close(fd)
        self._state = "closed"

    def fileno(self) -> int | None:
        return self._efd if self._efd >= 0 else None

    # -- producer thread: the message flow ----------------------------------------------------
    def fetch(self, n: int) -> list[Item]:
        """Hand out up to ``n`` buffered deliveries; a short answer arms the wake-up fd.

        ``fetch(0)`` only consumes a pending wake-up (a producer with no demand may call it
        so its poller does not keep reporting the fd readable).
        """
        with self._lock:
            if self._woken:
                self._consume_wake()
            ready = self._ready
            k = min(max(n, 0), len(ready))
            out = [ready.popleft() for _ in range(k)]
            self._want_wake = k < n and not self._paused
            self._wake_retry = _WAKE_LEASE
            self._rewake_at = 0.0
        self.fetched += k
        return out

    def ack(self, handles: list[Any]) -> None:
        if handles:
            self._command("ack", handles)

    def fail(self, failures: list[Failure]) -> None:
        if failures:
            self._command("fail", failures)

    def requeue(self, handles: list[Any]) -> None:
        if handles:
            self._command("requeue", handles)

    def exhausted(self) -> bool:
        """Nothing buffered and the broker confirmed the queue has no ready message.

        The confirmation is two passive ``queue.declare`` probes in a row answering 0 with no
        delivery in between (one alone can overtake a delivery already on its way).  Probes
        run only while someone asks, so a source nobody asks costs the broker nothing.
        """
        self._idle_asked_at = time.monotonic()
        with self._lock:
            if self._ready:
                return False
        return self._state == "connected" and self._empty_confirmed

    def retry_after(self) -> float:
        return 1.0   # push source: the fd wakes the producer, this is never the clock

    def pause(self) -> None:
        """Stop the broker pushing (basic.cancel) and give unfetched deliveries back.

        Drain and operator pause: the queue's other consumers (another daemon) get those
        messages at once instead of after this one closes.
        """
        with self._lock:
            self._paused = True
            self._want_wake = False
            if self._woken:
                self._consume_wake()
        self._command("pause", None)

    def resume(self) -> None:
        with self._lock:
            self._paused = False
        self._command("resume", None)

    def set_window(self, prefetch: int) -> None:
        """A resize changed the auto window: ``basic.qos`` again on the I/O thread (the
        broker applies it to deliveries from then on; a reconnect uses it too).  An
        explicit ``prefetch_count`` is kept as given."""
        if self.settings.prefetch_auto:
            self._command("window", prefetch)

    def stats(self) -> dict[str, Any]:
        s = self.settings
        return {
            "source": self.name, "state": self._state, "url": self.url_masked,
            "failed_to": _failed_to(s.on_failure, s.queue),
            "queue": s.queue, "prefetch_count": s.prefetch_count,
            "prefetch_auto": s.prefetch_auto, "on_failure": s.on_failure,
            "fetched": self.fetched, "acked": self.acked, "failed": self.failed,
            "rejected": self.rejected, "failure_requeued": self.failure_requeued,
            "requeued": self.requeued, "buffered": len(self._ready),
            "unacked": len(self._open_tags), "acks_pending": len(self._unsent_acks),
            "ack_frames": self.ack_frames,
            "deliveries": self.deliveries,
            "redelivered": self.redelivered, "stale": self.stale,
            "dropped_on_loss": self.dropped_on_loss, "returned": self.returned,
            "reconnects": self.reconnects, "oversized": self.oversized,
            "max_message_bytes": s.max_message_bytes,
            "incarnation": self._incarnation, "paused": self._paused,
            "last_error": self._last_error}

    # -- producer thread → I/O thread ---------------------------------------------------------
    def _command(self, op: str, arg: Any) -> None:
        self._commands.append((op, arg))
        if not self._wake_pending:
            self._wake_pending = True
            self._wake()

    def _wake(self) -> None:
        conn = self._conn
        if conn is None:
            return       # the I/O loop runs the commands when it is connected again
        with contextlib.suppress(amqp_errors.AMQPError, OSError):
            # closed or closing: the I/O loop notices on its own and runs the commands
            conn.add_callback_threadsafe(_noop)

    def _consume_wake(self) -> None:
        """Under ``_lock``: read the eventfd back to zero."""
        try:
            os.eventfd_read(self._efd)
        except (BlockingIOError, OSError):
            pass
        self._woken = False

    def _signal(self) -> None:
        """Under ``_lock``: make the fd readable once."""
        if not self._woken and self._efd >= 0:
            os.eventfd_write(self._efd, 1)
            self._woken = True
            self._woken_at = time.monotonic()

    # -- the I/O thread -----------------------------------------------------------------------
    def _io_main(self) -> None:
        retrying = tenacity.Retrying(
            sleep=self._closing.wait,
            stop=lambda _state: self._closing.is_set(),
            wait=backoff_wait(self.settings.backoff_min, self.settings.backoff_max),
            retry=tenacity.retry_if_exception(self._should_retry),
            before_sleep=self._before_retry,
            reraise=True)
        try:
            while not self._closing.is_set():
                try:
                    retrying(self._connect)
                except Exception as exc:
                    if not self._closing.is_set():
                        self._fatal = exc
                        self._state = "failed"
                        self._last_error = _describe(exc, self.settings.url)
                    break
                finally:
                    self._first_attempt.set()
                try:
                    self._serve()
                except Exception as exc:    # the thread must outlive any error
                    if self._closing.is_set():
                        break
                    if not isinstance(exc, (amqp_errors.AMQPError, OSError,
                                            _ConsumerCancelled)):
                        log.exception("rabbitmq source: unexpected error in the I/O loop")
                    self._lost(exc)
        finally:
            self._shutdown_connection()
            self._first_attempt.set()

    def _should_retry(self, exc: BaseException) -> bool:
        if self._closing.is_set():
            return False
        return self._opened_once or not _is_permanent(exc)

    def _before_retry(self, retry_state: tenacity.RetryCallState) -> None:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        self._state = "reconnecting"
        self._last_error = _describe(exc, self.settings.url) if exc else ""
        self._first_attempt.set()      # open() need not wait for an unreachable broker
        delay = retry_state.next_action.sleep if retry_state.next_action else 0.0
        log.warning("rabbitmq source: %s unreachable (%s); attempt %d failed, next in %s",
                    self.url_masked, self._last_error, retry_state.attempt_number,
                    next_attempt(delay))

    def _connect(self) -> None:
        s = self.settings
        self._state = "connecting"
        params = pika.URLParameters(s.url)
        params.heartbeat = s.heartbeat
        params.socket_timeout = s.connect_timeout
        params.stack_timeout = s.connect_timeout * 3
        params.blocked_connection_timeout = max(60.0, s.heartbeat * 2.0)
        params.connection_attempts = 1      # tenacity does the retrying, with jitter
        params.client_properties = {
            "connection_name": f"offbroadway {self.pipeline} producer_{self.producer_index}"}
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
        with self._lock:
            self._incarnation += 1
        self._conn, self._channel, self._probe_channel = conn, channel, None
        self._open_tags.clear()
        self._tag_order.clear()
        self._unsent_acks.clear()
        self._consuming = False
        self._broker_cancelled = False
        self._empty_confirmed = False
        self._zero_probes = 0
        if self._opened_once:
            self.reconnects += 1
            log.warning("rabbitmq source: reconnected to %s (incarnation %d)",
                        self.url_masked, self._incarnation)
        elif self._last_error:
            log.warning("rabbitmq source: connected to %s (it was unreachable: %s)",
                        self.url_masked, self._last_error)
        self._opened_once = True
        self._state = "connected"
        if not self._paused:
            self._start_consuming()
        self._wake_pending = False    # wakes posted while disconnected went nowhere

    def _start_consuming(self) -> None:
        if not self._consuming:
            self._consumer_tag = self._channel.basic_consume(
                self.settings.queue, self._on_delivery, auto_ack=False)
            self._consuming = True

    def _stop_consuming(self) -> None:
        """basic.cancel; pika rejects (requeue) what arrived but was not dispatched yet."""
        if self._consuming and self._consumer_tag is not None:
            self._channel.basic_cancel(self._consumer_tag)
        self._consuming = False
        with self._lock:
            back = list(self._ready)
            self._ready.clear()
        for _msg_id, _data, _meta, handle in back:
            if handle.incarnation == self._incarnation and \
                    self._settle_one(handle.tag, requeue=True):
                self.returned += 1

    def _serve(self) -> None:
        conn = self._conn
        assert conn is not None
        while not self._closing.is_set():
            self._run_commands()
            if self._broker_cancelled:
                raise _ConsumerCancelled("the broker cancelled the consumer (queue deleted?)")
            if not self._channel.is_open:
                raise amqp_errors.ChannelClosed(0, "the consuming channel closed")
            now = time.monotonic()
            timeout = 0.005 if self._woken else 0.2
            if self._unsent_acks:
                timeout = max(0.0, min(timeout, self._send_acks(now)))
            self._tend_wake(now)
            self._maybe_probe(now)
            conn.process_data_events(time_limit=timeout)
        self._run_commands()
        self._send_acks(force=True)

    def _lost(self, exc: BaseException) -> None:
        """The connection died: everything it held is the broker's to redeliver."""
        with self._lock:
            dropped = len(self._ready)
            self._ready.clear()
        self.dropped_on_loss += dropped
        self._open_tags.clear()
        self._tag_order.clear()
        self._unsent_acks.clear()     # the broker redelivers those: at-least-once
        self._empty_confirmed = False
        conn, self._conn, self._channel, self._probe_channel = self._conn, None, None, None
        self._consuming = False
        if conn is not None:
            _close_quietly(conn)
        self._state = "reconnecting"
        self._last_error = _describe(exc, self.settings.url)
        log.warning("rabbitmq source: connection to %s lost (%s); %d buffered deliveries "
                    "left to the broker, reconnecting", self.url_masked, self._last_error,
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
                    self._send_acks(force=True)
                    self._stop_consuming()
                conn.close()
        except (amqp_errors.AMQPError, OSError) as exc:
            log.debug("rabbitmq source: closing: %s", _describe(exc, self.settings.url))
            _close_quietly(conn)

    # -- I/O thread: deliveries and settling --------------------------------------------------
    def _on_delivery(self, _channel: Any, method: Any, props: Any, body: bytes | None) -> None:
        # per message, so kept lean: the properties are read from the instance dict in one
        # pass (pika sets all of them, unset ones None) and only non-plain values converted
        tag = method.delivery_tag
        redelivered = bool(method.redelivered)
        meta: dict[str, Any] = {
            "queue": self._queue, "routing_key": method.routing_key,
            "exchange": method.exchange, "delivery_tag": tag, "redelivered": redelivered}
        wanted = _PROPERTY_NAMES
        for name, value in vars(props).items():
            if value is not None and name in wanted:
                meta[name] = value if value.__class__ in _PLAIN else packable(value)
        headers = meta.pop("headers", None)
        if headers:
            meta["headers"] = headers
        inc = self._incarnation
        msg_id = props.message_id or f"{tag}@{self._session}.{inc}"
        if len(body) > self._max_bytes:
            # failed, not delivered: the body stays with the broker, which dead-letters
            # it whole (on_failure); it never crosses our frames or reaches a handler
            meta["error"] = oversized(len(body), self.settings.max_message_bytes)
            meta["body_bytes"] = len(body)
            body = None
            self.oversized += 1
        self._open_tags.add(tag)
        self._tag_order.append(tag)
        self.deliveries += 1
        if redelivered:
            self.redelivered += 1
        self._empty_confirmed = False
        self._zero_probes = 0
        with self._lock:
            self._ready.append((msg_id, body, meta, RabbitMQHandle(inc, tag, redelivered)))
            if self._want_wake:
                self._signal()

    def _on_broker_cancel(self, _frame: Any) -> None:
        self._broker_cancelled = True

    def _run_commands(self) -> None:
        self._wake_pending = False
        commands = self._commands
        while commands:
            op, arg = commands.popleft()
            if op == "ack":
                self._ack(arg)
            elif op == "fail":
                for handle, _reason in arg:
                    if self._current(handle):
                        requeue = self._failure_requeues(handle)
                        if self._settle_one(handle.tag, requeue=requeue):
                            self.failed += 1
                            if requeue:
                                self.failure_requeued += 1
                            else:
                                self.rejected += 1
            elif op == "requeue":
                for handle in arg:
                    if self._current(handle) and self._settle_one(handle.tag, requeue=True):
                        self.requeued += 1
            elif op == "pause" and self._channel is not None and self._paused:
                self._stop_consuming()
            elif op == "resume" and self._channel is not None and not self._paused:
                self._start_consuming()
            elif op == "window":
                self.settings = dataclasses.replace(self.settings, prefetch_count=arg)
                if self._channel is not None:
                    self._channel.basic_qos(prefetch_count=arg)
                log.info("rabbitmq source: prefetch %d auto (the pipeline was resized)", arg)

    def _current(self, handle: RabbitMQHandle) -> bool:
        """Is this handle from the live connection?  If not, the broker already requeued
        it and its tag may name another message now: never settle it."""
        if handle.incarnation == self._incarnation and self._channel is not None:
            return True
        self.stale += 1
        return False

    def _failure_requeues(self, handle: RabbitMQHandle) -> bool:
        policy = self.settings.on_failure
        if policy == "requeue":
            return True
        if policy == "reject_and_requeue_once":
            return not handle.redelivered
        return False

    def _settle_one(self, tag: int, *, requeue: bool) -> bool:
        """basic.reject one tag, once.  False if it was settled already."""
        if tag not in self._open_tags:
            self.stale += 1
            return False
        self._open_tags.discard(tag)
        self._channel.basic_reject(tag, requeue=requeue)
        return True

    def _ack(self, handles: list[RabbitMQHandle]) -> None:
        """Settle each live tag once; the broker is told in :meth:`_send_acks`."""
        open_tags, unsent = self._open_tags, self._unsent_acks
        inc = self._incarnation
        live = self._channel is not None
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

    def _send_acks(self, now: float = 0.0, *, force: bool = False) -> float:
        """Tell the broker what was settled: one ``multiple`` ack for the settled front.

        Every tag at the front of the delivery order that is no longer open was settled
        (acked, rejected or requeued); a multiple ack up to the last unsent ack among them
        acks exactly those (rejects went out at once, on the same channel, before it).
        Acks behind a still-open tag wait while the front moves; once it has stood still
        for ``_ACK_DELAY`` since they came (or on ``force``) they go one by one.  Returns
        the seconds until the next call is due.
        """
        unsent = self._unsent_acks
        if not unsent or self._channel is None:
            return _ACK_DELAY
        open_tags, order = self._open_tags, self._tag_order
        upto = 0
        covered = []
        while order and order[0] not in open_tags:
            t = order.popleft()
            if t in unsent:
                upto = t
                covered.append(t)
        channel = self._channel
        if upto:
            channel.basic_ack(upto, multiple=True)
            self.ack_frames += 1
            unsent.difference_update(covered)   # after the count: stats() reads both
        if not unsent:
            return _ACK_DELAY
        if upto:
            self._unsent_since = now or time.monotonic()  # the front moved: wait again
        due = self._unsent_since + _ACK_DELAY - (now or time.monotonic())
        if force or due <= 0:
            for t in sorted(unsent):
                channel.basic_ack(t)
            self.ack_frames += len(unsent)
            unsent.clear()
            return _ACK_DELAY
        return due

    # -- I/O thread: wake-ups and the idle probe ----------------------------------------------
    def _tend_wake(self, now: float) -> None:
        """Withdraw a wake-up the producer has not consumed, and offer it again later.

        The producer's poller is level-triggered: if it is woken while it has no demand it
        does not fetch and would see the fd readable on every poll.  So an unconsumed
        wake-up is withdrawn after a few ms and offered again after a growing pause.
        """
        with self._lock:
            if self._woken and now - self._woken_at > _WAKE_LEASE:
                self._consume_wake()
                self._rewake_at = now + self._wake_retry
                self._wake_retry = min(self._wake_retry * 2, _WAKE_RETRY_MAX)
            elif (not self._woken and self._want_wake and self._ready
                  and self._rewake_at and now >= self._rewake_at):
                self._rewake_at = 0.0
                self._signal()

    def _maybe_probe(self, now: float) -> None:
        if now < self._next_probe or now - self._idle_asked_at > 2.0 or self._paused:
            return
        if self._ready:
            self._zero_probes = 0
            return
        self._next_probe = now + _PROBE_INTERVAL
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
            self._empty_confirmed = False
            self._last_error = _describe(exc, self.settings.url)
            return
        # deliveries that arrived during the RPC are queued inside pika: dispatch them
        # before deciding, so a delivery overtaken by the probe's answer still counts
        conn.process_data_events(time_limit=0)
        if frame.method.message_count == 0 and self.deliveries == seen:
            self._zero_probes += 1     # (a delivery resets it to 0)
        else:
            self._zero_probes = 0
        self._empty_confirmed = self._zero_probes >= 2


def _noop() -> None:
    """Posted through add_callback_threadsafe only to wake the I/O loop."""


def _close_quietly(conn: pika.BlockingConnection) -> None:
    with contextlib.suppress(amqp_errors.AMQPError, OSError):
        if conn.is_open:
            conn.close()

