"""The contract between a producer stage and the thing it draws messages from.

A producer stage owns exactly one source.  It never interprets a message: it asks the source
for at most as many messages as its consumers demanded, keeps the source's opaque *handle*
for each one in its in-flight table, and later hands those handles back through exactly one
of ``ack`` (written downstream), ``fail`` (failed; the source applies its failure policy) or
``requeue`` (a stage downstream died, so the message must be delivered again).  That split
is what makes "nothing lost" a property of the source alone: a source that only forgets a
message on ``ack`` or after applying its failure policy in ``fail`` loses nothing however
the stages around it crash.

Two kinds of source fit this shape (GenStage's push and pull producers):

* pull sources (spool, generator) return ``None`` from :meth:`Source.fileno`; the producer
  calls :meth:`Source.fetch` whenever there is demand, and when a fetch comes back short it
  polls again after :meth:`Source.retry_after` seconds;
* push sources (a broker consumer) return a file descriptor that becomes readable when
  messages arrived; the producer's poller watches it and then calls ``fetch``.  Such a
  source buffers at most what the producer may hold and stops the broker beyond that
  (``pause``/``resume``), so back-pressure reaches the broker.

Everything a source returns travels over msgpack, so ``data`` and ``metadata`` must be
made of str/bytes/int/float/bool/None/list/dict.  A message the source already knows is
broken (a spool line that is not JSON) is still returned, as a :class:`FailedItem` naming
the problem: it then takes the ordinary failure path (``handle_failed``, then ``fail``)
instead of disappearing silently inside the source.  The reason travels beside the
message, not in its metadata, so the metadata a handler reads is the source's description
of the message and nothing else.
"""

from __future__ import annotations

import abc
import difflib
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..runtime.redact import mask_url
from ..wire.protocol import MAX_FRAME_BYTES

if TYPE_CHECKING:
    from .deadletters import DeadLetterBox

# (message id, data, metadata, handle).  The handle never leaves the producer process, so it
# may be any Python object that is cheap to keep: an int, a tuple, a record.
Item = tuple[str, Any, dict, Any]
# (handle, reason) as given to Source.fail
Failure = tuple[Any, str]


class FailedItem(tuple):
    """An :data:`Item` the source already knows is broken, with ``reason`` saying why.

    It unpacks as the ordinary four fields, so code that only moves items along needs no
    change; the producer sees the type and fails the message with ``reason`` (through
    ``handle_failed``, then :meth:`Source.fail`) without handing it to ``handle_message``.
    A tuple subclass and not a fifth field because failures are rare and every item's
    shape on the producer's hot path stays the same.
    """

    reason: str

    def __new__(cls, msg_id: str, data: Any, metadata: dict, handle: Any,
                reason: str) -> FailedItem:
        item = super().__new__(cls, (msg_id, data, metadata, handle))
        item.reason = reason
        return item

    def __reduce__(self) -> tuple[Any, ...]:
        return FailedItem, (*self, self.reason)


def failure_of(item: Item) -> Any:
    """Why the source failed ``item`` already, or None for a message to handle.

    A :class:`FailedItem`'s ``reason``; for compatibility with sources written before it,
    also a ``metadata["error"]`` that is not None, the earlier way of saying the same
    thing (taken as it is, as before).
    """
    if item.__class__ is FailedItem:
        return item.reason                         # type: ignore[attr-defined]
    return item[2].get("error")


class Source(abc.ABC):
    """Base class of every source; subclasses implement fetch/ack/fail/requeue/exhausted.

    Constructed once per producer process with the ``[producer.options]`` table of the config
    and the producer's place in the topology.  The constructor only validates and stores
    options (so ``offbroadway check`` can build one cheaply); connections, files and other
    resources are acquired in :meth:`open` and released in :meth:`close`.

    ``producer_index``/``producer_count`` let sources with several producers split the work
    deterministically (no message handed to two producers); ``state_dir`` is the daemon's
    private, persistent directory for a source that must remember something across restarts.
    """

    #: the name the source is registered under (``[producer] source = ...``)
    name: str = ""
    #: option names the source accepts; others are rejected with an error naming them.
    #: ``None`` disables the check (for sources that pass options through to a client).
    known_options: frozenset[str] | None = frozenset()
    #: the option that bounds this source's window of delivered, unsettled messages
    #: (RabbitMQ's ``prefetch_count``), or None for a source without one.  A source with a
    #: window accepts ``auto_prefetch``: see :meth:`sized_options`.
    window_option: str | None = None

    def __init__(self, options: Mapping[str, Any], *, pipeline: str = "", producer_index: int = 0,
                 producer_count: int = 1, state_dir: str = "") -> None:
        if producer_count < 1 or not 0 <= producer_index < producer_count:
            raise ValueError(f"{self.name or type(self).__name__}: producer_index "
                             f"{producer_index} is not within producer_count {producer_count}")
        self.options: dict[str, Any] = dict(options or {})
        self.pipeline = pipeline
        self.producer_index = producer_index
        self.producer_count = producer_count
        self.state_dir = state_dir
        self.validate_options(self.options)

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        """Raise :class:`SourceOptionError` (a ``ValueError``) naming the option if
        ``options`` cannot work.

        A classmethod so the config checker can validate without constructing the source.
        The base implementation rejects unknown option names; subclasses extend it.
        """
        if cls.known_options is not None:
            check_known_options(cls.name or cls.__name__, options, cls.known_options)

    @classmethod
    def sized_options(cls, options: Mapping[str, Any], capacity: int) -> dict[str, Any]:
        """The options a producer runs with, given the topology around it: the stages
        downstream of one producer can hold ``capacity`` messages (processors' demand,
        batches in the making and asked for), split over the producers.

        The daemon asks every source this; a source whose window of unsettled messages
        limits what it delivers (a broker's prefetch) must let at least that many out, or
        processors starve waiting for deliveries the broker holds back (the seeds'
        prefetch pitfall).  The default: a source with a :attr:`window_option` gets
        ``auto_prefetch = capacity``, which its ``"auto"`` window stands for (clamped to
        what its protocol can say); others run with their options as they are.
        """
        out = dict(options)
        if cls.window_option is not None:
            out["auto_prefetch"] = capacity
        return out

    @classmethod
    def preflight(cls, options: Mapping[str, Any]) -> list[str]:
        """What ``offbroadway check`` can verify of valid options without acquiring anything:
        raise :class:`SourceOptionError` for what :meth:`open` would certainly refuse (a
        spool directory that does not exist), and return notes on what only a live
        connection can tell (a broker's address), which ``check`` prints as such."""
        return []

    @classmethod
    def refused(cls, options: Mapping[str, Any], *, pipeline: str = "") -> str | None:
        """For ``run``, before anything starts (a JVM): the line :meth:`open` would raise as
        :class:`SourceError` (credentials, no such queue), found by connecting once; None
        when accepted, unreachable (retried by the source), or unknown (the default)."""
        return None

    @classmethod
    def nothing_to_read(cls, options: Mapping[str, Any]) -> str | None:
        """For ``run --until-idle``: a sentence saying why, when this source certainly has
        nothing to deliver, so the daemon starts nothing (a Spark server takes half a
        minute to write no rows); None otherwise, and whenever only a connection could tell
        (the default)."""
        return None

    @classmethod
    def dead_letters(cls, options: Mapping[str, Any], *, pipeline: str,
                     state_dir: str) -> DeadLetterBox | None:
        """Where this source keeps the messages it failed, for ``offbroadway dead-letters``
        to list and replay (:mod:`.deadletters`); None: it keeps none."""
        return None

    # -- lifecycle ----------------------------------------------------------------------------
    def open(self) -> None:
        """Acquire resources (files, connections).  Called once, before the first fetch."""

    def close(self) -> None:
        """Release resources.  Unsettled messages stay owed and are delivered again later."""

    def fileno(self) -> int | None:
        """Push sources: an fd that is readable when messages wait.  Pull sources: ``None``."""
        return None

    # -- the message flow ---------------------------------------------------------------------
    @abc.abstractmethod
    def fetch(self, n: int) -> list[Item]:
        """Return at most ``n`` messages (possibly none); requeued messages come first."""

    @abc.abstractmethod
    def ack(self, handles: list[Any]) -> None:
        """These messages are done for good: forget them (durably, if the source persists)."""

    @abc.abstractmethod
    def fail(self, failures: list[Failure]) -> None:
        """These messages failed after ``handle_failed``: apply the failure policy.

        Whatever the policy (reject, dead-letter, requeue at the broker), once this returns
        the messages are settled as far as the producer is concerned.
        """

    @abc.abstractmethod
    def requeue(self, handles: list[Any]) -> None:
        """Hand these back for redelivery: a stage downstream died holding them."""

    @abc.abstractmethod
    def exhausted(self) -> bool:
        """True when there is nothing more to give right now and nothing requeued waits.

        ``--until-idle`` drains the pipeline once every producer's source is exhausted and
        nothing is in flight, so a source must not claim this while it could still deliver.
        """

    def taken_back(self) -> str | None:
        """Why this source took back all it had in flight since the last call (a lost
        broker connection), once; else None.  The producer tells the daemon, which tells
        the committers to check for the stale copies (docs/design-spark.md)."""

    def retry_after(self) -> float:
        """Seconds until a pull source is worth polling again after a short fetch."""
        return 0.1

    def pause(self) -> None:
        """Stop taking in messages (the stop's drain, or the operator's pause: ``offbroadway
        drain``); fetch is not called."""

    def resume(self) -> None:
        """Undo :meth:`pause`."""

    def stats(self) -> dict[str, Any]:
        """Counters for ``status`` and metrics: at least fetched, acked, failed, requeued,
        and ``unacked`` (messages this source still owes: delivered but not settled)."""
        return {"source": self.name}


# -- option helpers, shared by every source so errors read the same everywhere ---------------

class SourceError(RuntimeError):
    """The server refuses the source as configured (credentials refused, no such queue,
    stream or vhost, a key that is not a stream), so :meth:`Source.open` cannot succeed
    until someone changes the config or the server.  Its message is the one line an
    operator needs, the server's own words included: the stage process says it and exits
    with :data:`EXIT_SOURCE_REFUSED`, instead of dying with a traceback.  A server that
    merely does not answer is not this: a source retries that."""


#: the exit code of a stage whose source the server refused (EX_CONFIG, from sysexits.h)
EXIT_SOURCE_REFUSED = 78


class SourceOptionError(ValueError):
    """A ``[producer.options]`` entry is wrong; ``option`` names it for the config checker."""

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


def check_known_options(source: str, options: Mapping[str, Any], known: Iterable[str]) -> None:
    """Reject option names the source does not know: a typo must not silently do nothing."""
    known = frozenset(known)
    unknown = sorted(set(options) - known)
    if unknown:
        listed = ", ".join(sorted(known)) or "none"
        close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise SourceOptionError(f"{source} source: unknown option {unknown[0]!r}{hint} "
                                f"(known options: {listed})", unknown[0])


def option_int(source: str, options: Mapping[str, Any], key: str, default: int | None, *,
               minimum: int | None = None) -> int | None:
    """An optional integer option; bools are refused although Python counts them as ints."""
    value = options.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SourceOptionError(f"{source} source: option {key!r} must be an integer, "
                                f"got {value!r}", key)
    if minimum is not None and value < minimum:
        raise SourceOptionError(f"{source} source: option {key!r} must be >= {minimum}, "
                                f"got {value}", key)
    return value


def option_float(source: str, options: Mapping[str, Any], key: str, default: float, *,
                 minimum: float = 0.0) -> float:
    """A number option (int or float in TOML); must be at least ``minimum``."""
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SourceOptionError(f"{source} source: option {key!r} must be a number, "
                                f"got {value!r}", key)
    if value < minimum:
        raise SourceOptionError(f"{source} source: option {key!r} must be >= {minimum}, "
                                f"got {value}", key)
    return float(value)


def option_str(source: str, options: Mapping[str, Any], key: str, default: str | None, *,
               required: bool = False) -> str | None:
    """A string option; ``required`` makes its absence an error that names it."""
    if key not in options:
        if required:
            raise SourceOptionError(f"{source} source: option {key!r} is required", key)
        return default
    value = options[key]
    if not isinstance(value, str) or not value:
        raise SourceOptionError(f"{source} source: option {key!r} must be a non-empty "
                                f"string, got {value!r}", key)
    return value


def backoff_wait(minimum: float, maximum: float) -> Callable[[Any], float]:
    """Seconds before reconnect attempt ``n`` (a tenacity wait: takes the retry state):
    exponential from ``minimum``, capped at ``maximum``, with "equal jitter" (a random
    point in the upper half of the cap).  Producers of several daemons do not retry in
    step, and no wait after the first few is shorter than ``maximum / 2``, so the one log
    line per attempt stays a bounded number per minute however long a broker is down."""
    import random

    def wait(retry_state: Any) -> float:
        n = max(1, int(getattr(retry_state, "attempt_number", 1)))
        cap = min(maximum, minimum * 2 ** min(n - 1, 60))
        return cap / 2 + random.uniform(0, cap / 2)
    return wait


def not_contacted(server: str, url: str, what: str) -> str:
    """A broker source's note from ``check`` (:meth:`Source.preflight`): validation does
    not connect, so whether the broker answers shows only when the daemon runs."""
    return (f"{server} at {mask_url(url)} is not contacted by check: whether it is "
            f"reachable, and {what} usable, shows only when the daemon runs")


class _Attempt:
    """What :func:`backoff_wait` reads of a tenacity retry state."""

    attempt_number = 1


class Backoff:
    """The sources' backoff (:func:`backoff_wait`), driven by hand, for a source that
    retries from the producer's thread (the ``redis`` source): the producer's loop must not
    sleep, so the source only remembers when the next attempt is due."""

    def __init__(self, minimum: float, maximum: float) -> None:
        self._wait = backoff_wait(minimum, maximum)
        self._state = _Attempt()
        self.failures = 0
        self.next_at = 0.0

    def failed(self) -> float:
        self.failures += 1
        self._state.attempt_number = self.failures
        delay = self._wait(self._state)
        self.next_at = time.monotonic() + delay
        return delay

    def reset(self) -> None:
        self.failures = 0
        self.next_at = 0.0


def next_attempt(delay: float) -> str:
    """``"2.5s (at 11:38:20)"``: when a broker source tries again, in a retry's log line."""
    at = time.time() + delay
    return f"{delay:.1f}s (at {time.strftime('%H:%M:%S', time.localtime(at))})"


# -- message size ------------------------------------------------------------------------------

#: ``max_message_bytes`` when a source's options do not set it (16 MiB, RabbitMQ 4's own
#: default limit): big enough for any sane record, small enough that a frame of a few such
#: messages stays under the wire's frame limit and a prefetch window of them fits in memory.
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
#: the largest ``max_message_bytes`` accepted: one message must fit in one frame with room
#: for its metadata (see :data:`offbroadway.stages.wire.protocol.MAX_FRAME_BYTES`)
MAX_MESSAGE_BYTES_LIMIT = MAX_FRAME_BYTES * 3 // 4


def option_max_message_bytes(source: str, options: Mapping[str, Any]) -> int:
    """The ``max_message_bytes`` option: an integer from 1 to
    :data:`MAX_MESSAGE_BYTES_LIMIT`, default :data:`DEFAULT_MAX_MESSAGE_BYTES`."""
    value = option_int(source, options, "max_message_bytes", DEFAULT_MAX_MESSAGE_BYTES,
                       minimum=1)
    assert value is not None
    if value > MAX_MESSAGE_BYTES_LIMIT:
        raise SourceOptionError(
            f"{source} source: option 'max_message_bytes' must be at most "
            f"{MAX_MESSAGE_BYTES_LIMIT} ({MAX_MESSAGE_BYTES_LIMIT >> 20} MiB: a message must "
            f"fit in one frame between stages), got {value}", "max_message_bytes")
    return value


def oversized(size: int, limit: int, what: str = "message") -> str:
    """The failure reason of a message over ``max_message_bytes``: what an operator reads in
    ``handle_failed``, the processor's log and the dead letter."""
    return (f"{what} of {size} bytes is over max_message_bytes ({limit}); not delivered to "
            f"handle_message")
