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

An *event* is ``[origin, token, id, data, metadata]`` (:data:`ORIGIN` … :data:`METADATA`;
nothing outside this module indexes one by number): the producer index and in-flight token
that address its acknowledgement, then the message.  What a frame's events share is said
once, in the frame: the ``status`` (None, or why they are already failed: a producer
sends failed events in frames of their own) and the ``batch_key`` (a processor sends one
frame per key; the batcher is the one the frame goes to).  The events travel *packed*: a
msgpack array inside the frame as one ``bin`` field, so that the frame is validated once
(the header by :func:`decode`, the events when they are opened, by
:func:`open_events` in one pass) and a batcher can move them on without unpacking each
(:func:`split_events` cuts the array into its events' bytes, :func:`batch` joins them
again).  Messages are built only where user code runs (:func:`to_messages`); the
envelope (origin and token) is not the user's to see: a :class:`~offbroadway.Message`
holds it in private slots that only this module sets and reads (:data:`envelope_of`).

Values.  Besides msgpack's own types (None, bool, int, float, str, bytes, lists, maps;
a tuple travels as a list), the codec carries the values a handler commonly returns, as
msgpack extension types whose payload is plain text or bytes (never code):

=====  ===========================  ============================================
code   type                         payload
=====  ===========================  ============================================
1      ``datetime.datetime``        ISO 8601 (``isoformat``: the UTC offset kept
                                    when there is one, none when naive; a zone of
                                    the tz database arrives as its fixed offset,
                                    ``fold`` is not carried)
2      ``datetime.date``            ISO 8601
3      ``datetime.time``            ISO 8601 (with its offset, if any)
4      ``decimal.Decimal``          ``str`` (exact; NaN and infinities too)
5      ``uuid.UUID``                its 16 bytes
=====  ===========================  ============================================

Anything else is refused by the encoder (:func:`unpackable`, called only once a frame
failed to encode, says which value of which message), so the stage that holds the message
fails that message alone; an extension payload that does not parse fails the frame like
any malformed frame.

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

import datetime as _dt
from collections.abc import Callable, Sequence
from decimal import Decimal
from operator import attrgetter
from typing import Any
from uuid import UUID

import msgpack
import msgspec
import zmq
from offbroadway import Message

#: 2: events are five fields and travel packed under a frame header (issue 12)
VERSION = 2
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
SCHEMA_IPC, SCHEMA_ERROR, SCHEMA_STAGING = 1, 2, 3
COMMIT_REF, COMMIT_TRIGGER, COMMIT_ROWS, COMMIT_FILE, COMMIT_SCHEMA = 1, 2, 3, 4, 5
RESULT_REF, RESULT_ERROR, RESULT_SCHEMA = 1, 2, 3

#: zmq.EVENTS and zmq.POLLIN as plain ints: readiness is checked before every read, and
#: pyzmq's enum flags cost microseconds per operation
ZMQ_EVENTS = int(zmq.EVENTS)
ZMQ_POLLIN = int(zmq.POLLIN)

#: an event's fields, by name (the only place their positions are written down)
ORIGIN, TOKEN, ID, DATA, METADATA = range(5)
EVENT_FIELDS = 5
#: the first byte of a packed event: a fixarray of EVENT_FIELDS
_EVENT_HEAD = 0x90 | EVENT_FIELDS
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


# -- the codec: msgpack plus a few extension types ---------------------------------------------

EXT_DATETIME, EXT_DATE, EXT_TIME, EXT_DECIMAL, EXT_UUID = 1, 2, 3, 4, 5


def _ext(value: Any) -> msgpack.ExtType:
    """The extension type of a value msgpack has no type for (msgpack calls this only for
    those, so it costs nothing on ordinary data); TypeError for anything else."""
    cls = type(value)
    if cls is _dt.datetime or isinstance(value, _dt.datetime):    # before date: a subclass
        return msgpack.ExtType(EXT_DATETIME, value.isoformat().encode())
    if cls is _dt.date or isinstance(value, _dt.date):
        return msgpack.ExtType(EXT_DATE, value.isoformat().encode())
    if isinstance(value, _dt.time):
        return msgpack.ExtType(EXT_TIME, value.isoformat().encode())
    if isinstance(value, Decimal):
        return msgpack.ExtType(EXT_DECIMAL, str(value).encode())
    if isinstance(value, UUID):
        return msgpack.ExtType(EXT_UUID, value.bytes)
    raise TypeError(f"can not serialize {cls.__name__!r} object")


def _from_ext(code: int, payload: bytes | memoryview) -> Any:
    """The value of an extension type (a payload that does not parse raises ValueError, and
    the frame is malformed); an unknown code stays an ``ExtType``, as msgpack leaves it."""
    if code == EXT_DATETIME:
        return _dt.datetime.fromisoformat(str(payload, "utf-8"))
    if code == EXT_DATE:
        return _dt.date.fromisoformat(str(payload, "utf-8"))
    if code == EXT_TIME:
        return _dt.time.fromisoformat(str(payload, "utf-8"))
    if code == EXT_DECIMAL:
        return Decimal(str(payload, "utf-8"))
    if code == EXT_UUID:
        return UUID(bytes=bytes(payload))
    return msgpack.ExtType(code, bytes(payload))


#: how msgpack's own unpacker reads what this codec wrote (the blame record's reader)
UNPACK_OPTIONS: dict[str, Any] = {"raw": False, "strict_map_key": False, "ext_hook": _from_ext}

_packer = msgpack.Packer(use_bin_type=True, default=_ext)
_pack = _packer.pack
#: Frames and events are read by msgspec's decoder: the same msgpack, the same values
#: (arrays as lists, maps as dicts, bin as bytes, the extension types above), about a
#: third less CPU than msgpack's unpacker on a frame of events, mostly from reusing the
#: strings of map keys that repeat from one event to the next.  Writing stays msgpack's:
#: msgspec encodes datetime, Decimal and UUID natively, as text or a timestamp that would
#: come back as another type.
_unpack = msgspec.msgpack.Decoder(ext_hook=_from_ext).decode


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


def give_back(evs: Sequence[Sequence[Any]]) -> bytes:
    """RETURN: events received and not started, for their producer to dispatch again."""
    return _frame(RETURN, _pack(evs))


def events(evs: Sequence[Sequence[Any]], status: str | None = None,
           batch_key: Any = DEFAULT) -> bytes:
    """EVENTS: event arrays that share ``status`` and ``batch_key``."""
    return _frame(EVENTS, status, batch_key, _pack(evs))


def batch(batch_key: Any, trigger: str, raw: Sequence[bytes]) -> bytes:
    """BATCH of events still packed, one ``bytes`` each (:func:`split_events`): joined
    under an array header, never unpacked and packed again."""
    return _frame(BATCH, batch_key, trigger, _array_header(len(raw)) + b"".join(raw))


def _array_header(n: int) -> bytes:
    """msgpack's array header for ``n`` elements (fixarray, array 16 or array 32)."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


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

def open_events(packed: bytes) -> list[list]:
    """The event arrays of an EVENTS, RETURN or BATCH frame, checked in one pass (C-speed
    ``map``s over the frame, not a Python check per event): a list of arrays of
    :data:`EVENT_FIELDS`, else :class:`ProtocolError`."""
    try:
        evs = _unpack(packed)
    except Exception as exc:  # msgpack raises several types for bad input
        raise ProtocolError(f"undecodable events: {type(exc).__name__}: {exc}") from None
    if type(evs) is not list or (evs and (set(map(type, evs)) != {list}
                                          or set(map(len, evs)) != {EVENT_FIELDS})):
        raise ProtocolError("events field is not a list of event arrays")
    return evs


def split_events(packed: bytes) -> list[bytes]:
    """The packed events of a frame, one ``bytes`` each, without building them (msgpack's
    ``skip``): what a batcher needs to regroup events it does not read.  Each piece is
    checked to be an array of :data:`EVENT_FIELDS` by its first byte."""
    unpacker = msgpack.Unpacker(max_buffer_size=max(len(packed), 1))
    unpacker.feed(packed)
    try:
        n = unpacker.read_array_header()
        skip, tell = unpacker.skip, unpacker.tell
        start = tell()
        out: list[bytes] = []
        append = out.append
        for _ in range(n):
            skip()
            end = tell()
            append(packed[start:end])
            start = end
    except Exception as exc:  # msgpack raises several types for bad input
        raise ProtocolError(f"undecodable events: {type(exc).__name__}: {exc}") from None
    if start != len(packed) or (out and bytes(p[0] for p in out).count(_EVENT_HEAD) != n):
        raise ProtocolError("events field is not a list of event arrays")
    return out


# -- messages and their envelope ------------------------------------------------------------
# A message's delivery envelope (its origin producer and in-flight token) is the runtime's:
# :class:`~offbroadway.Message` keeps it in two private slots that only this codec sets
# (:func:`_message`, :func:`address`) and reads (:func:`to_events`, :func:`ack_groups`,
# :data:`envelope_of`), with one reader beside it, the blame record (:mod:`..poison.blame`).
# Slots, not a proxy object beside each message: a message is built once per message in
# every stage that runs user code, and a slot read is the cheapest read.

#: a message's envelope as ``(origin, token)`` (for tests and handlers of the tests)
envelope_of = attrgetter("_origin", "_token")


def _message(origin: int, token: int, id: Any, data: Any, metadata: Any, batcher: str,
             batch_key: Any, status: str | None, _new: Any = object.__new__,
             _cls: type = Message) -> Message:
    """A message off the wire (the runtime's constructor, not the user's): slots set
    directly, positionally, which costs about half of ``Message(...)`` with its keywords;
    it is called once per message in every stage that runs user code."""
    m = _new(_cls)
    m.id = id
    m.data = data
    m.metadata = metadata
    m.batcher = batcher
    m.batch_key = batch_key
    m.status = status
    m._origin = origin
    m._token = token
    return m


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


def to_messages(evs: list[list], status: str | None = None, batcher: str = DEFAULT,
                batch_key: Any = DEFAULT) -> list[Message]:
    """Messages for user code, from events that share ``status``, ``batcher`` and
    ``batch_key`` (as :func:`open_events` returned them)."""
    make = _message
    return [make(origin, token, msg_id, data, metadata, batcher, batch_key, status)
            for origin, token, msg_id, data, metadata in evs]


def to_events(messages: Sequence[Message]) -> list[list]:
    """The events of messages going on to the next stage (batch key and status travel in
    the frame: see :func:`events`)."""
    return [[m._origin, m._token, m.id, m.data, m.metadata] for m in messages]


def event_to_message(e: Sequence[Any], status: str | None = None) -> Message:
    """One event as a message (routing functions that need one; not the hot path)."""
    return _message(e[ORIGIN], e[TOKEN], e[ID], e[DATA], e[METADATA], DEFAULT, DEFAULT, status)


def raw_to_message(raw: bytes) -> Message:
    """One packed event (:func:`split_events`) as a message (a batcher's partition_by)."""
    return event_to_message(_unpack(raw))


def new_events(origin: int, first_token: int, items: Sequence[Sequence[Any]]) -> list[list]:
    """Events for a source's fetched ``(id, data, metadata, handle)`` items, with tokens
    from ``first_token`` on (one comprehension: the producer's hot path)."""
    return [[origin, first_token + i, msg_id, data, metadata]
            for i, (msg_id, data, metadata, _) in enumerate(items)]


def event_id(e: Sequence[Any]) -> Any:
    return e[ID]


def event_token(e: Sequence[Any]) -> Any:
    return e[TOKEN]


def event_origin(e: Sequence[Any]) -> Any:
    return e[ORIGIN]


def event_payload(e: Sequence[Any]) -> tuple[Any, Any]:
    return e[DATA], e[METADATA]


def replace_payload(e: list, data: Any, metadata: Any) -> None:
    """Swap an event's data and metadata in place (a value msgpack cannot carry)."""
    e[DATA] = data
    e[METADATA] = metadata

def packable(value: Any) -> bool:
    """Whether ``value`` can cross the wire (the codec's types, nothing else)."""
    try:
        _pack(value)
    except Exception:
        return False
    return True


def unpackable(value: Any, where: str) -> str | None:
    """Where in ``value`` (named ``where``, e.g. ``data``) the first value the codec cannot
    carry sits, and what it is, e.g. ``data['when'][2] is a set``; None if it all packs.
    Only called once a frame failed to encode: it tries the parts one by one."""
    if packable(value):
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            if not packable(k):
                return f"a key of {where} ({k!r}) is a {type(k).__name__}"
            found = unpackable(v, f"{where}[{k!r}]")
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = unpackable(v, f"{where}[{i}]")
            if found is not None:
                return found
    if isinstance(value, int):
        return f"{where} is an int out of the wire's 64-bit range"
    cls = type(value)
    name = (cls.__qualname__ if cls.__module__ == "builtins"
            else f"{cls.__module__}.{cls.__qualname__}")
    return f"{where} is a {name} ({CARRIED} cross stages)"


#: what a message's values may be, said in the line of a message that failed to encode
CARRIED = "JSON's types, bytes, tuples, datetime, date, time, Decimal and UUID"


def message_unpackable(m: Message) -> str | None:
    """What of a message cannot cross to the next stage (its data, metadata, id or batch
    key), or None."""
    for value, where in ((m.data, "data"), (m.metadata, "metadata"), (m.id, "the id"),
                         (m.batch_key, "the batch key")):
        found = unpackable(value, where)
        if found is not None:
            return found
    return None
