"""The ``redis`` source: one Redis stream, read through a consumer group (redis-py).

Redis Streams are pull-based (seed 001's SQS shape): ``fetch(n)`` is one ``XREADGROUP
COUNT n`` when consumers ask, so demand reaches Redis directly and nothing is buffered in
the daemon.  The consumer group is the unit of sharing: every daemon (and every producer
in it) is a distinct consumer of the pipeline's group, Redis hands each entry to exactly
one of them, and an entry stays in the group's pending list (PEL) until ``XACK``.

Why the consumer name is stable (``<pipeline>-<host>-<instance>-<producer index>``, the
instance being a hash of the daemon's state dir): after a crash the same consumer comes
back, reads its own pending history first (``XREADGROUP ... 0``) and finishes at once what
it held, instead of waiting ``claim_idle_ms`` for another consumer to claim it; and dead
names do not pile up in the group.  Two daemons on one host have different state dirs, so
different names.

Entries a *dead* consumer (another host that never came back) left pending are taken over
with ``XAUTOCLAIM`` once idle for ``claim_idle_ms``.  So that a *live* consumer's slow
messages are never taken from it, this source refreshes the idle time of what it holds in
flight (``XCLAIM ... JUSTID`` to itself) every ``claim_idle_ms / 3``: only a consumer that
stopped doing that (it is dead or frozen) loses its entries.

Every Redis error (the server restarted, ``CLIENT KILL``) is surfaced, never retried
blindly inside redis-py: a reply lost with its connection may have delivered entries to us
that we never saw, so after an error the source re-reads its own pending history, and acks
that could not be sent are kept and sent again.  Reconnection waits with exponential
backoff and jitter (:func:`.base.backoff_wait`), without blocking the producer's loop.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ...runtime.redact import describe_error, mask_url
from ...runtime.tally import SentAcks
from ..base import (
    Backoff,
    FailedItem,
    Failure,
    Item,
    Source,
    SourceError,
    next_attempt,
    not_contacted,
    oversized,
)
from .entries import RedisHandle, entry_size, field_map, id_text, json_field
from .settings import KNOWN_OPTIONS, NAME, parse_options

if TYPE_CHECKING:
    from .replay import RedisDeadLetters

log = logging.getLogger("offbroadway.sources.redis")

_CHUNK = 1000           # ids per XACK / XCLAIM command
_HISTORY_ROUNDS = 8     # XREADGROUP history reads per fetch at most (skipping in-flight)
_IDLE_POLL_MIN = 0.002  # first retry after an empty read; doubles up to poll_ms
_PRUNE_IDLE_MS = 24 * 3_600_000   # a consumer unseen this long with nothing pending is gone


class RedisStreamsSource(Source):
    """Consumes ``stream`` as one consumer of ``group``; see the module docstring.

    ``message.data`` is the entry's field map, keys and values as ``str`` when they are
    valid UTF-8 and ``bytes`` otherwise; ``message.id`` is the entry id;
    ``metadata`` has ``stream``, ``group``, ``consumer``, ``id`` and ``delivery`` (``new``,
    ``pending`` for a re-read of our own pending history, ``claimed`` from another
    consumer) plus ``redelivered`` (not ``new``).
    """

    name = NAME
    known_options = KNOWN_OPTIONS

    def __init__(self, options: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(options, **kwargs)
        st = parse_options(self.options)
        self.url: str = st.url
        self.url_masked = mask_url(self.url)
        self.stream: str = st.stream
        self.group: str = st.group or self.pipeline or "offbroadway"
        self.consumer: str = st.consumer or self._default_consumer()
        self.create_group: bool = st.create_group
        self.start_id: str = st.start_id
        self.block_ms: int = st.block_ms
        self.poll_s: float = st.poll_ms / 1000
        self.claim_idle_ms: int = st.claim_idle_ms
        self.on_failure: str = st.on_failure
        self.dead_letter_stream: str = st.dead_letter_stream or f"{self.stream}:dead"
        self.dead_letter_maxlen: int | None = st.dead_letter_maxlen
        self.socket_timeout = st.socket_timeout
        self.max_message_bytes = st.max_message_bytes
        self.decode, self.decode_field = st.decode, st.decode_field
        #: ``decode = "json"``: the field whose JSON value is ``message.data``, else None
        self._json_field: str | None = st.decode_field if st.decode == "json" else None
        self._backoff = Backoff(st.backoff_min, st.backoff_max)
        self._client: redis.Redis | None = None
        self._state = "new"
        self._last_error = ""
        self._paused = False
        # entry id → handle for what the producer holds; the ids we must not hand out again
        self._inflight: dict[str, RedisHandle] = {}
        # failed with on_failure = leave_pending: pending, not in flight, not to be re-read
        self._left_pending: set[str] = set()
        self._history: str | None = "0"      # cursor in our own pending history, or done
        self._unsent_acks: list[str] = []
        self._unsent_dead: list[tuple[RedisHandle, str]] = []
        self._claim_cursor = "0-0"
        self._next_claim = 0.0
        self._next_touch = 0.0
        self._idle_wait = _IDLE_POLL_MIN
        # counters
        self.fetched = self.acked = self.failed = self.dead_lettered = self.requeued = 0
        #: where the count of acks Redis applied is kept for the daemon (the tally)
        self._sent_book: SentAcks | None = None
        self.claimed = self.vanished = self.reconnects = self.errors = 0
        self.oversized = self.undecodable = 0

    @classmethod
    def refused(cls, options: Mapping[str, Any], *, pipeline: str = "") -> str | None:
        from .refusal import refusal

        return refusal(parse_options(options), pipeline)

    @classmethod
    def preflight(cls, options: Mapping[str, Any]) -> list[str]:
        s = parse_options(options)
        return [not_contacted("Redis", s.url, f"the stream {s.stream!r}")]

    @classmethod
    def dead_letters(cls, options: Mapping[str, Any], *, pipeline: str,
                     state_dir: str) -> RedisDeadLetters:
        from .replay import RedisDeadLetters

        return RedisDeadLetters(options)

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        super().validate_options(options)
        parse_options(options)

    def _default_consumer(self) -> str:
        instance = hashlib.sha1(os.path.abspath(self.state_dir or os.getcwd()).encode(),
                                usedforsecurity=False).hexdigest()[:8]
        return (f"{self.pipeline or 'offbroadway'}-{socket.gethostname()}-{instance}-"
                f"{self.producer_index}")

    # -- lifecycle ----------------------------------------------------------------------------
    def open(self) -> None:
        """Connect and make sure the group exists; a wrong URL or a refused command raises.

        A server that is down is not fatal: the source retries with backoff and ``stats``
        shows ``state = "disconnected"``.
        """
        self._client = redis.Redis.from_url(
            self.url, socket_timeout=self.socket_timeout + self.block_ms / 1000,
            socket_connect_timeout=self.socket_timeout, socket_keepalive=True,
            # every error must reach us (see the module docstring): no hidden retries
            retry=Retry(NoBackoff(), 0), retry_on_timeout=False,
            client_name=self.consumer[:64].replace(" ", "_"))
        try:
            self._connect()
        except (redis.ResponseError, redis.AuthenticationError) as exc:
            # a wrong password or a key that is not a stream: fail at start
            self._client.close()
            self._client = None
            raise SourceError(f"redis source: cannot read stream {self.stream!r} as group "
                              f"{self.group!r} at {self.url_masked}: "
                              f"{describe_error(exc, self.url)}") from exc
        except redis.RedisError as exc:
            self._on_error(exc)
        log.info("redis source: stream %r group %r consumer %r at %s: %s", self.stream,
                 self.group, self.consumer, self.url_masked, self._state)

    def close(self) -> None:
        """Send what is owed (acks, dead letters); in-flight entries stay pending to this
        consumer name, so the next start re-reads them."""
        if self._client is None:
            return
        try:
            self._flush_unsent()
        except redis.RedisError as exc:
            log.warning("redis source: could not flush %d acks / %d dead letters at close: "
                        "%s (they stay pending and are delivered again)",
                        len(self._unsent_acks), len(self._unsent_dead),
                        describe_error(exc, self.url))
        self._client.close()
        self._client = None
        self._state = "closed"

    def _connect(self) -> None:
        client = self._client
        assert client is not None
        client.ping()
        if self.create_group:
            try:
                client.xgroup_create(self.stream, self.group, id=self.start_id, mkstream=True)
                log.info("redis source: created group %r on %r from %s", self.group,
                         self.stream, self.start_id)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        if self._state == "disconnected":
            self.reconnects += 1
            log.warning("redis source: reconnected to %s", self.url_masked)
        else:
            self._prune_consumers()
        self._state = "connected"
        self._backoff.reset()

    def _prune_consumers(self) -> None:
        """Forget consumers of the group that hold nothing and were not seen for a day.

        Daemons on hosts whose names change (containers) leave one consumer per incarnation
        behind; with nothing pending, deleting one loses nothing, and a live consumer that
        was merely idle is recreated by its next read.
        """
        client = self._client
        assert client is not None
        try:
            consumers = client.xinfo_consumers(self.stream, self.group)
        except redis.ResponseError:
            return
        for c in consumers:
            name = id_text(c["name"])
            if c.get("pending") == 0 and c.get("idle", 0) > _PRUNE_IDLE_MS \
                    and name != self.consumer:
                client.xgroup_delconsumer(self.stream, self.group, name)
                log.info("redis source: removed consumer %r (nothing pending, idle %.0f h)",
                         name, c["idle"] / 3_600_000)

    def _ready(self) -> bool:
        """Connected, or reconnected now if the backoff allows; never sleeps."""
        if self._client is None:
            return False
        if self._state == "connected":
            return True
        if time.monotonic() < self._backoff.next_at:
            return False
        try:
            self._connect()
        except redis.RedisError as exc:
            self._on_error(exc)
            return False
        return True

    def _on_error(self, exc: BaseException) -> None:
        self.errors += 1
        self._last_error = describe_error(exc, self.url)
        delay = self._backoff.failed()
        # one line per failed attempt (the backoff bounds them: at most one per backoff_max)
        what = "unreachable" if self._state != "connected" else "connection lost"
        log.warning("redis source: %s %s (%s); attempt %d failed, next in %s",
                    self.url_masked, what, self._last_error, self._backoff.failures,
                    next_attempt(delay))
        self._state = "disconnected"
        # a reply lost with the connection may have given us entries we never saw
        self._history = "0"

    # -- the message flow ---------------------------------------------------------------------
    def fetch(self, n: int) -> list[Item]:
        """Own pending history first (requeued, or left from a crash), then entries claimed
        from dead consumers, then new entries."""
        if n <= 0 or self._paused or not self._ready():
            return []
        out: list[Item] = []
        try:
            self._housekeeping()
            if self._history is not None:
                self._read_history(n, out)
            if len(out) < n and self.claim_idle_ms and time.monotonic() >= self._next_claim:
                self._autoclaim(n - len(out), out)
            if len(out) < n:
                self._take(self._read(">", n - len(out), block=True), "new", out)
        except redis.ResponseError as exc:
            if "NOGROUP" in str(exc) and self.create_group:
                self._state = "disconnected"     # recreate the group on the next attempt
            self._on_error(exc)
        except redis.RedisError as exc:
            self._on_error(exc)
        self.fetched += len(out)
        self._idle_wait = _IDLE_POLL_MIN if out else min(self._idle_wait * 2, self.poll_s)
        return out

    def _read(self, cursor: str, count: int, *, block: bool = False) -> list[tuple[Any, dict]]:
        """One XREADGROUP: ``>`` for new entries, an id for our own pending history."""
        client = self._client
        assert client is not None
        reply = client.xreadgroup(self.group, self.consumer, {self.stream: cursor},
                                  count=count,
                                  block=self.block_ms if block and self.block_ms else None)
        return reply[0][1] if reply else []

    def _read_history(self, n: int, out: list[Item]) -> None:
        for _ in range(_HISTORY_ROUNDS):
            cursor = self._history
            if cursor is None or len(out) >= n:
                return
            entries = self._read(cursor, n - len(out))
            if not entries:
                self._history = None
                return
            self._history = id_text(entries[-1][0])
            self._take(entries, "pending", out)

    def _take(self, entries: Iterable[tuple[Any, dict]], delivery: str,
              out: list[Item]) -> None:
        """Entries → items, skipping what we already hold and acking deleted entries."""
        inflight, skip = self._inflight, self._left_pending
        limit = self.max_message_bytes
        vanished: list[str] = []
        meta_base = {"stream": self.stream, "group": self.group, "consumer": self.consumer,
                     "delivery": delivery, "redelivered": delivery != "new"}
        for raw_id, fields in entries:
            if raw_id is None:
                continue
            entry_id = id_text(raw_id)
            if entry_id in inflight or (delivery == "pending" and entry_id in skip):
                continue
            if not fields:          # deleted (XDEL / trimmed) while pending: nothing to do
                vanished.append(entry_id)
                continue
            skip.discard(entry_id)
            handle = RedisHandle(entry_id, fields)
            inflight[entry_id] = handle
            meta = {**meta_base, "id": entry_id}
            size = entry_size(fields)
            if size > limit:
                # failed, not delivered: dead-lettered whole from the handle (on_failure)
                self.oversized += 1
                meta["entry_bytes"] = size
                out.append(FailedItem(entry_id, None, meta, handle,
                                      oversized(size, limit, "entry")))
                continue
            if self._json_field is None:
                out.append((entry_id, field_map(fields), meta, handle))
                continue
            data, failed = json_field(fields, self._json_field, meta)
            if failed is None:
                out.append((entry_id, data, meta, handle))
            else:
                self.undecodable += 1
                out.append(FailedItem(entry_id, data, meta, handle, failed))
        if vanished:
            self.vanished += len(vanished)
            self._xack(vanished)

    def _autoclaim(self, n: int, out: list[Item]) -> None:
        client = self._client
        assert client is not None
        reply = client.xautoclaim(self.stream, self.group, self.consumer, self.claim_idle_ms,
                                  start_id=self._claim_cursor, count=max(n, 10))
        cursor, entries = id_text(reply[0]), reply[1]
        before = len(out)
        # our own entries come back too once idle: in-flight ones (the touch lagged) are
        # skipped; left-pending ones are due for their retry, which is the point
        self._take([(i, f) for i, f in entries if i is not None], "claimed", out)
        self.claimed += len(out) - before
        if cursor == "0-0":
            self._claim_cursor = "0-0"
            self._next_claim = time.monotonic() + self._claim_interval()
            self._forget_left_pending()
        else:
            self._claim_cursor = cursor      # more to scan: continue on the next fetch

    def _forget_left_pending(self) -> None:
        """Drop left-pending ids another consumer claimed (and settled) meanwhile."""
        if not self._left_pending:
            return
        client = self._client
        assert client is not None
        mine = client.xpending_range(self.stream, self.group, "-", "+",
                                     len(self._inflight) + len(self._left_pending) + 1000,
                                     consumername=self.consumer)
        self._left_pending &= {id_text(p["message_id"]) for p in mine}

    def _claim_interval(self) -> float:
        return min(max(self.claim_idle_ms / 2000, 0.05), 10.0)

    def _housekeeping(self) -> None:
        """Resend owed acks and dead letters; keep our in-flight entries from going idle."""
        self._flush_unsent()
        if not self.claim_idle_ms or not self._inflight:
            return
        now = time.monotonic()
        if now < self._next_touch:
            return
        self._next_touch = now + max(self.claim_idle_ms / 3000, 0.02)
        client = self._client
        assert client is not None
        ids = list(self._inflight)
        pipe = client.pipeline(transaction=False)
        for i in range(0, len(ids), _CHUNK):
            pipe.xclaim(self.stream, self.group, self.consumer, 0, ids[i:i + _CHUNK],
                        justid=True)
        pipe.execute()

    def count_acks(self, book: SentAcks) -> None:
        """Keep the count of acks Redis applied in ``book`` (``acks_sent`` in stats): an
        ack the producer handed over is not applied while the connection is down."""
        self._sent_book = book

    def ack(self, handles: list[Any]) -> None:
        ids = []
        inflight = self._inflight
        for h in handles:
            if inflight.pop(h.id, None) is not None:
                ids.append(h.id)
        if not ids:
            return
        self._unsent_acks.extend(ids)
        try:
            self._flush_unsent()
        except redis.RedisError as exc:
            self._on_error(exc)

    def _xack(self, ids: list[str]) -> None:
        client = self._client
        assert client is not None
        if len(ids) <= _CHUNK:
            client.xack(self.stream, self.group, *ids)
            return
        pipe = client.pipeline(transaction=False)
        for i in range(0, len(ids), _CHUNK):
            pipe.xack(self.stream, self.group, *ids[i:i + _CHUNK])
        pipe.execute()

    def _flush_unsent(self) -> None:
        if self._client is None or self._state != "connected":
            return
        if self._unsent_acks:
            ids = self._unsent_acks
            self._xack(ids)
            self._unsent_acks = []
            self.acked += len(ids)
            if self._sent_book is not None:
                # counted once Redis answered the XACK: an ack held while disconnected,
                # lost with the process, is claimed again and counted then, once
                self._sent_book.left(self.acked)
        if self._unsent_dead:
            dead = self._unsent_dead
            self._dead_letter(dead)
            self._unsent_dead = []
            self.dead_lettered += len(dead)

    def fail(self, failures: list[Failure]) -> None:
        """``dead_letter``: copy to the dead-letter stream and XACK, in one MULTI/EXEC.
        ``leave_pending``: leave it pending; it is retried once idle for ``claim_idle_ms``
        (claimed by whichever consumer of the group scans first, this one included)."""
        mine = [(h, reason) for h, reason in failures if self._inflight.pop(h.id, None)]
        if not mine:
            return
        self.failed += len(mine)
        if self.on_failure == "leave_pending":
            self._left_pending.update(h.id for h, _ in mine)
            return
        self._unsent_dead.extend(mine)
        try:
            self._flush_unsent()
        except redis.RedisError as exc:
            self._on_error(exc)

    def _dead_letter(self, failures: list[tuple[RedisHandle, str]]) -> None:
        client = self._client
        assert client is not None
        now = str(time.time())
        pipe = client.pipeline(transaction=True)
        for h, reason in failures:
            fields = dict(h.fields)
            fields.update({"dead_letter.id": h.id, "dead_letter.stream": self.stream,
                           "dead_letter.group": self.group,
                           "dead_letter.consumer": self.consumer,
                           "dead_letter.reason": str(reason)[:2000], "dead_letter.at": now})
            if self.dead_letter_maxlen:
                pipe.xadd(self.dead_letter_stream, fields, maxlen=self.dead_letter_maxlen,
                          approximate=True)
            else:
                pipe.xadd(self.dead_letter_stream, fields)
        ids = [h.id for h, _ in failures]
        for i in range(0, len(ids), _CHUNK):
            pipe.xack(self.stream, self.group, *ids[i:i + _CHUNK])
        pipe.execute()

    def requeue(self, handles: list[Any]) -> None:
        """Leave them pending and re-read our own pending history, so they come first."""
        n = 0
        for h in handles:
            if self._inflight.pop(h.id, None) is not None:
                n += 1
        if n:
            self.requeued += n
            self._history = "0"

    def exhausted(self) -> bool:
        """No undelivered entry for the group (``lag``), no own history to re-read, nothing
        owed to Redis, and no entry claimable from a dead consumer right now."""
        if self._history is not None or self._unsent_acks or self._unsent_dead:
            if self._state == "connected" and (self._unsent_acks or self._unsent_dead):
                try:
                    self._housekeeping()
                except redis.RedisError as exc:
                    self._on_error(exc)
            return False
        if self._client is None or not self._ready():
            return False
        try:
            self._housekeeping()
            return self._nothing_left()
        except redis.RedisError as exc:
            self._on_error(exc)
            return False

    def _nothing_left(self) -> bool:
        client = self._client
        assert client is not None
        group = next((g for g in client.xinfo_groups(self.stream)
                      if id_text(g["name"]) == self.group), None)
        if group is None:
            return False
        lag = group.get("lag")
        if lag is None:       # Redis < 7 or lag unknown: compare ids instead
            last = id_text(client.xinfo_stream(self.stream)["last-generated-id"])
            if id_text(group["last-delivered-id"]) != last:
                return False
        elif lag:
            return False
        if not self.claim_idle_ms or not group.get("pending"):
            return True
        mine = self._inflight.keys() | self._left_pending
        idle = client.xpending_range(self.stream, self.group, "-", "+", len(mine) + 1,
                                     idle=self.claim_idle_ms)
        return all(id_text(p["message_id"]) in mine for p in idle)

    def retry_after(self) -> float:
        if self._state != "connected":
            return max(0.0, self._backoff.next_at - time.monotonic())
        return self._idle_wait

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._paused = False

    def stats(self) -> dict[str, Any]:
        return {
            "source": self.name, "state": self._state, "url": self.url_masked,
            "failed_to": (f"stream {self.dead_letter_stream!r}" if self.on_failure ==
                          "dead_letter" else f"left pending in group {self.group!r}"),
            "stream": self.stream, "group": self.group, "consumer": self.consumer,
            "on_failure": self.on_failure, "fetched": self.fetched, "acked": self.acked,
            "failed": self.failed, "dead_lettered": self.dead_lettered,
            "left_pending": len(self._left_pending), "requeued": self.requeued,
            "claimed": self.claimed, "vanished": self.vanished, "buffered": 0,
            "unacked": len(self._inflight) + len(self._left_pending)
            + len(self._unsent_acks) + len(self._unsent_dead),
            "unsent_acks": len(self._unsent_acks), "acks_sent": self.acked,
            "reconnects": self.reconnects,
            "errors": self.errors, "paused": self._paused, "last_error": self._last_error,
            "oversized": self.oversized, "max_message_bytes": self.max_message_bytes,
            "decode": self.decode,
            "undecodable": self.undecodable}
