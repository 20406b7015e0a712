"""The wire protocol: every message two stages (or a stage and the daemon) exchange.

Nothing else in the project builds or parses frames.  A frame is one ZeroMQ message part
holding a msgpack array ``[VERSION, KIND, *fields]``.  msgpack, never pickle: a peer must
not be able to make another stage run code.  Decoding checks the version, the kind and
the arity, and a frame over :data:`MAX_FRAME_BYTES` is refused before it is unpacked, so
a malformed, unknown or oversized frame is a :class:`ProtocolError` that the receiving
loop counts, logs and drops.

Data plane (GenStage's messages):

=============  ====================  ====================================================
kind           direction             fields
=============  ====================  ====================================================
SUBSCRIBE      consumer → producer   max_demand, min_demand, partition (or None), ref (int)
SUBSCRIBED     producer → consumer   policy (str): the producer's dispatcher, "spread",
                                     "demand" or "partition"; ref echoed from SUBSCRIBE
ASK            consumer → producer   n (new demand, added to what is outstanding)
RETRACT        consumer → producer   n: take back up to n of the consumer's unmet demand
RETRACTED      producer → consumer   k: how much was taken back (k ≤ n, k ≤ unmet demand)
RETURN         consumer → producer   events (packed) it received and will not start soon
                                     (long jobs that arrived together): back to the buffer
EVENTS         producer → consumer   status, batch_key, events (packed): many per frame
CANCEL         either way            reason (str); from a producer it also means "done"
ACK            finisher → origin     ok tokens, failed [token, reason] pairs
BATCH          batcher → batch proc  batch_key, trigger, events (packed; one batch per frame)
=============  ====================  ====================================================

SUBSCRIBED and RETRACTED are exact because ZeroMQ keeps order per connection: every event
the producer sent before answering reaches the consumer before the answer, so after
SUBSCRIBED the consumer's unmet demand there is exactly 0, and after RETRACTED k it is
exactly what it was minus the events received minus k (see :mod:`.demand`).  The ref tells
the answer to the latest SUBSCRIBE from the answer to an earlier one (a subscription sent
again after a producer restart can meet one still queued for the new incarnation).

An *event* is a message in transit (:mod:`.events`): its envelope (origin producer and
in-flight token), its id, and its data and metadata as the bytes they were encoded to once,
at the producer.  What a frame's events share is said once, in the frame: the ``status``
(None, or why they are already failed: a producer sends failed events in frames of their
own) and the ``batch_key`` (a processor sends one frame per key; the batcher is the one the
frame goes to); inside the events, their data's codec, and an origin, a run of tokens or a
metadata that all share.  The events travel *packed* as columns (one ``bin`` field, so that
the frame header is validated once by :func:`decode` and the events when they are opened,
by :func:`open_events`, in one C call and a few C-speed checks).  Messages are built only
where user code runs (:func:`to_messages`), and decode a value only when user code reads it.

Values are those of :mod:`.values` (msgpack plus datetime, date, time, Decimal and UUID).

Control plane (stage ↔ daemon, over the daemon's hub socket):

=============  ====================  ====================================================
COMMAND        daemon → stage        name, args (dict)
REPORT         stage → daemon        name, body (dict): ``stats``, ``idle``, ``done``…
=============  ====================  ====================================================

Spark hand-off (a batch processor and its batcher's committer, over the committer's ROUTER;
the batch processor connects a DEALER under its stage id).  Rows do not travel here: a
batch processor writes its batch as a Parquet file into the staging area
(:mod:`.spark_staging`) and hands over the file's name; Spark reads the files of a
whole group in one job.  Frames carry names and schemas, never rows.

=============  ======================  ==================================================
HELLO          batch proc → committer  (none): a new incarnation; the committer forgets
                                       the batches of the previous one that no job holds
                                       yet and answers with SCHEMA
SCHEMA         committer → batch proc  schema (Arrow IPC schema bytes, or None: not fixed
                                       yet), error (str or None: every row fails with it,
                                       e.g. a DDL Spark cannot parse), staging (str: the
                                       URI of the directory where this batcher's batches
                                       are staged)
COMMIT         batch proc → committer  ref (int), trigger (str), rows (int), file (str:
                                       the staged file's name), schema (the file's Arrow
                                       schema, IPC bytes)
RESULT         committer → batch proc  ref, error (None: the Spark job holding the batch
                                       committed), schema (the dataset's schema, IPC
                                       bytes or None)
=============  ======================  ==================================================
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

import zmq
from offbroadway import Message

from . import events as ev

#: 3: events travel as columns, their data and metadata encoded once at the producer
VERSION = 3
#: Frames larger than this are refused unread (64 MiB: a batch of 100k rows of ~600 B).
MAX_FRAME_BYTES = 64 * 1024 * 1024

#: positions in a decoded frame (:func:`decode` returns ``[kind, *fields]``): stages read
#: fields by these names, never by number
KIND_AT = 0
#: the one field of ASK, RETRACT, RETRACTED (n, k) and CANCEL (reason)
VALUE = 1
SUBSCRIBE_MAX, SUBSCRIBE_MIN, SUBSCRIBE_PARTITION, SUBSCRIBE_REF = 1, 2, 3, 4
SUBSCRIBED_POLICY, SUBSCRIBED_REF = 1, 2
EVENTS_STATUS, EVENTS_BATCH_KEY, EVENTS_PACKED = 1, 2, 3
BATCH_KEY, BATCH_TRIGGER, BATCH_PACKED = 1, 2, 3
RETURN_PACKED = 1
ACK_OK, ACK_FAILED = 1, 2
COMMAND_NAME, COMMAND_ARGS = 1, 2
REPORT_NAME, REPORT_BODY = 1, 2
SCHEMA_IPC, SCHEMA_ERROR, SCHEMA_STAGING = 1, 2, 3
COMMIT_REF, COMMIT_TRIGGER, COMMIT_ROWS, COMMIT_FILE, COMMIT_SCHEMA = 1, 2, 3, 4, 5
RESULT_REF, RESULT_ERROR, RESULT_SCHEMA = 1, 2, 3

#: zmq.EVENTS and zmq.POLLIN as plain ints: readiness is checked before every read, and
#: pyzmq's enum flags cost microseconds per operation
ZMQ_EVENTS = int(zmq.EVENTS)
ZMQ_POLLIN = int(zmq.POLLIN)

#: the batcher and batch key of a message nobody routed
DEFAULT = "default"

SUBSCRIBE = 1
ASK = 2
EVENTS = 3
CANCEL = 4
ACK = 5
BATCH = 6
SUBSCRIBED = 7
RETRACT = 8
RETRACTED = 9
COMMAND = 10
REPORT = 11
RETURN = 12
HELLO = 13
SCHEMA = 14
COMMIT = 15
RESULT = 16

#: kind -> number of fields after [VERSION, KIND]
_ARITY = {SUBSCRIBE: 4, ASK: 1, EVENTS: 3, CANCEL: 1, ACK: 2, BATCH: 3, SUBSCRIBED: 2,
          RETRACT: 1, RETRACTED: 1, RETURN: 1, COMMAND: 2, REPORT: 2, HELLO: 0, SCHEMA: 3,
          COMMIT: 5, RESULT: 3}
KIND_NAMES = {SUBSCRIBE: "subscribe", ASK: "ask", EVENTS: "events", CANCEL: "cancel",
              ACK: "ack", BATCH: "batch", SUBSCRIBED: "subscribed", RETRACT: "retract",
              RETRACTED: "retracted", RETURN: "return", COMMAND: "command", REPORT: "report",
              HELLO: "hello", SCHEMA: "schema", COMMIT: "commit", RESULT: "result"}

#: Why a subscription ends: the reason a CANCEL carries (GenStage's cancel reasons, as
#: named constants: every stage compares against these, never a string of its own).
#: The upstream is done (it drained, or it stops): no more events will come.
CANCEL_SHUTDOWN = "shutdown"
#: A consumer a resize removes is leaving; its producer answers with the same reason,
#: after every event it sent, so everything sent arrived before the answer.
CANCEL_LEAVING = "leaving"
#: An ask or a cancel for a subscription this producer does not know (it restarted): what
#: the consumer had out there is void, and the daemon's resubscribe follows.
CANCEL_UNKNOWN = "unknown subscription"
#: The answer to a consumer's cancel of a subscription that is not leaving.
CANCEL_UNSUBSCRIBED = "unsubscribed"
#: A subscription the dispatcher refuses (a partition it does not have…): the reason
#: follows this prefix, ``"bad subscription: <why>"``.
CANCEL_BAD_SUBSCRIPTION = "bad subscription"


class ProtocolError(ValueError):
    """A frame this protocol cannot accept; the receiver counts it and drops it."""


# the codec lives in :mod:`.values`; these names stay importable from here
from .values import (  # noqa: E402, F401 (re-exported: one codec, two names)
    CARRIED,
    EXT_DATE,
    EXT_DATETIME,
    EXT_DECIMAL,
    EXT_TIME,
    EXT_UUID,
    UNPACK_OPTIONS,
    _pack,
    _unpack,
    message_unpackable,
    packable,
    unpackable,
)


def _frame(*parts: Any) -> bytes:
    return _pack([VERSION, *parts])


# -- encoders -------------------------------------------------------------------------------

def subscribe(max_demand: int, min_demand: int, partition: Any = None, ref: int = 0) -> bytes:
    return _frame(SUBSCRIBE, max_demand, min_demand, partition, ref)


def subscribed(policy: str, ref: int) -> bytes:
    return _frame(SUBSCRIBED, policy, ref)


def ask(n: int) -> bytes:
    return _frame(ASK, n)


def retract(n: int) -> bytes:
    return _frame(RETRACT, n)


def retracted(k: int) -> bytes:
    return _frame(RETRACTED, k)


def give_back(rows: Sequence[Sequence[Any]], codec: int = ev.MSGPACK) -> bytes:
    """RETURN: events received and not started, for their producer to dispatch again."""
    return _frame(RETURN, _pack(ev.row_columns(rows, codec)))


def events(rows: Sequence[Sequence[Any]], status: str | None = None,
           batch_key: Any = DEFAULT, codec: int = ev.MSGPACK) -> bytes:
    """EVENTS: event rows that share ``status``, ``batch_key`` and their data's ``codec``."""
    return _frame(EVENTS, status, batch_key, _pack(ev.row_columns(rows, codec)))


def message_events(messages: Sequence[Message], batch_key: Any = DEFAULT) -> bytes:
    """EVENTS of healthy messages going on to the next stage (a processor's output): the
    data nobody read goes on as the bytes it came with (:func:`.events.message_columns`)."""
    return _frame(EVENTS, None, batch_key, _pack(ev.message_columns(messages)))


def batch(batch_key: Any, trigger: str, rows: ev.Block | Sequence[Sequence[Any]]) -> bytes:
    """BATCH of events, a block or rows (their data in the values codec: the batcher keeps
    one)."""
    cols = rows.columns() if isinstance(rows, ev.Block) else ev.row_columns(rows, ev.MSGPACK)
    return _frame(BATCH, batch_key, trigger, _pack(cols))


def cancel(reason: str) -> bytes:
    return _frame(CANCEL, reason)


def ack(ok: Sequence[int], failed: Sequence[Sequence[Any]] = ()) -> bytes:
    """ACK: ``ok`` tokens (sent as one ``[first, count]`` range when they are consecutive,
    the usual case: a batch's messages were emitted together) and failed ``[token,
    reason]`` pairs; the receiver reads ``ok`` with :func:`acked_tokens`."""
    n = len(ok)
    if n > 2:
        first = ok[0]
        if type(first) is int and ok[-1] == first + n - 1 and ok == list(range(first,
                                                                              first + n)):
            return _frame(ACK, [[first, n]], failed)
    return _frame(ACK, ok, failed)


#: the longest token range an ACK may name (a range is one frame's messages; this bounds
#: what a hostile one can cost)
MAX_ACK_RANGE = 1 << 20


def acked_tokens(ok: list) -> list:
    """The tokens of an ACK's ``ok`` field: plain tokens, and ``[first, count]`` ranges
    expanded (a range that is not two ints, or longer than :data:`MAX_ACK_RANGE`, is
    passed on as it is: the in-flight table counts it unknown)."""
    if not ok or type(ok[0]) is not list:
        if not any(type(t) is list for t in ok):
            return ok
    out: list = []
    for t in ok:
        if (type(t) is list and len(t) == 2 and type(t[0]) is int and type(t[1]) is int
                and 0 <= t[1] <= MAX_ACK_RANGE):
            out.extend(range(t[0], t[0] + t[1]))
        else:
            out.append(t)
    return out


def command(name: str, args: dict | None = None) -> bytes:
    return _frame(COMMAND, name, args or {})


def report(name: str, body: dict | None = None) -> bytes:
    return _frame(REPORT, name, body or {})


def hello() -> bytes:
    """HELLO: a batch processor's new incarnation, to its committer."""
    return _frame(HELLO)


def schema(schema_ipc: bytes | None, error: str | None, staging: str) -> bytes:
    """SCHEMA: the committer's answer to HELLO (see the Spark hand-off table)."""
    return _frame(SCHEMA, schema_ipc, error, staging)


def commit(ref: int, trigger: str, rows: int, file: str, schema_ipc: bytes) -> bytes:
    """COMMIT: a staged batch's file, for the committer's next Spark job."""
    return _frame(COMMIT, ref, trigger, rows, file, schema_ipc)


def result(ref: int, error: str | None, schema_ipc: bytes | None) -> bytes:
    """RESULT: how the Spark job holding batch ``ref`` ended (``error`` None: committed)."""
    return _frame(RESULT, ref, error, schema_ipc)


def frames_within_limit(items: list, encode: Callable[[list], bytes]
                        ) -> list[tuple[bytes, list]]:
    """``encode(items)`` as one frame, or as several (each with the items it carries) when
    one would be over :data:`MAX_FRAME_BYTES`: the receiver would drop it, and the events
    in it would stay in flight forever, a stall.  Halving costs a re-encode only when a
    frame is too big.  A single event over the limit goes alone: preventing it is the
    sender's job (sources fail messages over ``max_message_bytes``)."""
    frame = encode(items)
    if len(frame) <= MAX_FRAME_BYTES or len(items) <= 1:
        return [(frame, items)]
    half = len(items) // 2
    return (frames_within_limit(items[:half], encode)
            + frames_within_limit(items[half:], encode))


# -- decoder --------------------------------------------------------------------------------

def decode(frame: bytes) -> list:
    """``[KIND, *fields]`` of a well-formed frame, else :class:`ProtocolError`."""
    if len(frame) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(frame)} bytes over the {MAX_FRAME_BYTES} limit")
    try:
        msg = _unpack(frame)
    except Exception as exc:  # msgpack raises several types for bad input
        raise ProtocolError(f"undecodable frame: {type(exc).__name__}: {exc}") from None
    if not isinstance(msg, list) or len(msg) < 2:
        raise ProtocolError("frame is not an array [version, kind, ...]")
    version, kind = msg[0], msg[1]
    if version != VERSION:
        raise ProtocolError(f"protocol version {version!r}, expected {VERSION}")
    arity = _ARITY.get(kind) if isinstance(kind, int) else None
    if arity is None:
        raise ProtocolError(f"unknown message kind {kind!r}")
    if len(msg) != arity + 2:
        raise ProtocolError(f"{KIND_NAMES[kind]} with {len(msg) - 2} fields, expected {arity}")
    del msg[0]
    _check_fields(msg)
    return msg


def _check_fields(msg: list) -> None:
    kind = msg[0]
    if kind in (ASK, RETRACT, RETRACTED):
        if not isinstance(msg[1], int) or isinstance(msg[1], bool) or msg[1] < 0:
            raise ProtocolError(f"{KIND_NAMES[kind]} of {msg[1]!r}")
    elif kind == SUBSCRIBED:
        if not isinstance(msg[1], str) or not isinstance(msg[2], int):
            raise ProtocolError("subscribed needs a policy and a ref")
    elif kind == SUBSCRIBE:
        if not (isinstance(msg[1], int) and isinstance(msg[2], int) and 0 <= msg[2] <= msg[1]
                and msg[1] > 0):
            raise ProtocolError(f"subscribe with max/min demand {msg[1]!r}/{msg[2]!r}")
        if not isinstance(msg[4], int):
            raise ProtocolError(f"subscribe with ref {msg[4]!r}")
    elif kind == EVENTS:
        if not (msg[1] is None or isinstance(msg[1], str)) or not isinstance(msg[3], bytes):
            raise ProtocolError("events need a status (None or a string) and packed events")
    elif kind == RETURN:
        if not isinstance(msg[1], bytes):
            raise ProtocolError("return needs packed events")
    elif kind == BATCH:
        if not isinstance(msg[2], str) or not isinstance(msg[3], bytes):
            raise ProtocolError("batch needs a trigger (a string) and packed events")
    elif kind == ACK:
        if not isinstance(msg[1], list) or not isinstance(msg[2], list):
            raise ProtocolError("ack fields are not lists")
    elif kind in (COMMAND, REPORT):
        if not isinstance(msg[1], str) or not isinstance(msg[2], dict):
            raise ProtocolError("command/report needs a name and a map")
    elif kind == CANCEL and not isinstance(msg[1], str):
        raise ProtocolError("cancel reason is not a string")
    elif kind == SCHEMA:
        if not (_opt(msg[1], bytes) and _opt(msg[2], str) and isinstance(msg[3], str)):
            raise ProtocolError("schema needs a schema (bytes or None), an error (str or "
                                "None) and a staging URI")
    elif kind == COMMIT:
        if not (_int(msg[1]) and isinstance(msg[2], str) and _int(msg[3])
                and isinstance(msg[4], str) and isinstance(msg[5], bytes)):
            raise ProtocolError("commit needs a ref, a trigger, rows, a file name and a "
                                "schema")
    elif kind == RESULT:
        if not (_int(msg[1]) and _opt(msg[2], str) and _opt(msg[3], bytes)):
            raise ProtocolError("result needs a ref, an error (str or None) and a schema "
                                "(bytes or None)")


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _opt(value: Any, cls: type) -> bool:
    return value is None or isinstance(value, cls)


# -- events ---------------------------------------------------------------------------------

def open_events(packed: bytes) -> ev.Block:
    """The events of an EVENTS, RETURN or BATCH frame (its packed columns), checked in one
    pass (:func:`.events.open_block`), else :class:`ProtocolError`."""
    try:
        return ev.open_block(_unpack(packed))
    except ev.EventsError as exc:
        raise ProtocolError(f"malformed events: {exc}") from None
    except Exception as exc:  # msgspec raises several types for bad input
        raise ProtocolError(f"undecodable events: {type(exc).__name__}: {exc}") from None


# -- messages and their envelope ------------------------------------------------------------
# A message's delivery envelope (its origin producer and in-flight token) is the runtime's:
# :class:`~offbroadway.Message` keeps it in two private slots that only the codec sets
# (:func:`.events.to_messages`, :func:`address`) and reads (:func:`.events.message_columns`,
# :func:`ack_groups`, :data:`envelope_of`).  Slots, not a proxy object beside each message:
# a message is built once per message in every stage that runs user code, and a slot read is
# the cheapest read.

#: a message's envelope as ``(origin, token)`` (for tests and handlers of the tests)
envelope_of = attrgetter("_origin", "_token")

#: a row's fields, by name (:mod:`.events`)
ORIGIN, TOKEN, ID, DATA, METADATA = ev.ORIGIN, ev.TOKEN, ev.ID, ev.DATA, ev.METADATA


def address(message: Message, origin: int, token: int) -> Message:
    """Give ``message`` a delivery envelope (the acks of ``message`` go to producer
    ``origin`` as ``token``) and return it: for tests and benches that build messages
    by hand; the stages get theirs off the wire (:func:`to_messages`)."""
    message._origin = origin
    message._token = token
    return message


def ack_groups(ok: Sequence[Message], failed: Sequence[Message]
               ) -> dict[int, tuple[list, list]]:
    """Finished messages by their origin producer: origin -> (the ok tokens, the failed
    ``[token, reason]`` pairs), one :func:`ack` frame each.  The envelope is read here, in
    the codec, with plain slot reads (faster than a getter call per message)."""
    groups: dict[int, tuple[list, list]] = {}
    if ok:
        first = ok[0]._origin
        origins = [m._origin for m in ok]
        if origins.count(first) == len(origins):    # one producer: the usual case
            groups[first] = ([m._token for m in ok], [])
        else:
            for m in ok:
                groups.setdefault(m._origin, ([], []))[0].append(m._token)
    for m in failed:
        groups.setdefault(m._origin, ([], []))[1].append([m._token, m.status or "failed"])
    return groups


def to_messages(block: ev.Block, status: str | None = None, batcher: str = DEFAULT,
                batch_key: Any = DEFAULT) -> list[Message]:
    """Messages for user code, from a frame's events that share ``status``, ``batcher`` and
    ``batch_key`` (as :func:`open_events` returned them)."""
    return ev.to_messages(block, status, batcher, batch_key)


def event_to_message(row: Sequence[Any], status: str | None = None,
                     codec: int = ev.MSGPACK) -> Message:
    """One event row as a message (routing functions that need one; not the hot path)."""
    return ev.row_message(row, codec, status)


def new_events(origin: int, first_token: int, items: Sequence[Sequence[Any]]) -> list[tuple]:
    """Rows for a source's ``(id, data, metadata, handle)`` items, with tokens from
    ``first_token`` on, their values encoded (the producer does this in two steps, to
    know the codec and the items the codec refused)."""
    _, ids, datas, metas, _ = ev.encode_items(items)
    return ev.new_rows(origin, first_token, ids, datas, metas)


def event_id(e: Sequence[Any]) -> Any:
    return e[ID]


def event_token(e: Sequence[Any]) -> Any:
    return e[TOKEN]


def event_origin(e: Sequence[Any]) -> Any:
    return e[ORIGIN]
