"""Events on the wire: one flat record per message, in columns, its data left as bytes.

An event is a message in transit: ``(origin, token, id, data, metadata)``, the producer
index and in-flight token that address its acknowledgement, then the message.  Its
``data`` and ``metadata`` travel *encoded* (bytes), and stay so through every hop that
does not read them: the producer encodes them once (a broker's body is already bytes and
is not encoded at all), the batcher moves them without decoding, and a stage that runs user
code builds messages that decode a value only when the code reads it
(:class:`WireMessage`) and send the bytes they came with when it did not.  So the per-message
work of a hop that does not look at a message is a few pointer copies in C, and a handler
that routes without reading ``data`` pays nothing for it.

A frame's events are packed as columns, ``[codec, origins, tokens, ids, datas, metas]``,
one msgpack array decoded in one C call (:func:`open_block`):

==========  ==========================================================================
column      what it holds
==========  ==========================================================================
codec       how every ``datas`` entry is encoded: :data:`MSGPACK` (the values codec,
            :mod:`.values`) or :data:`BYTES` (the data *is* those bytes: a broker's body)
origins     one int, every event's, or a list of ints
tokens      one int, the first of consecutive tokens (the usual case: a producer numbers
            a fetch in order), or a list of ints
ids         a list: each message's id
datas       a list of bytes: each message's encoded data
metas       one bytes, every event's metadata encoded once (a source whose messages share
            it, e.g. the generator's), or a list of bytes
==========  ==========================================================================

Where stages route, buffer or give back single events (the producer's buffer and poison
guard, the batcher's accumulator, a processor's RETURN), an event is a *row*: a tuple in the
order above, read by :data:`ORIGIN` … :data:`METADATA`, never by number elsewhere.  A
:class:`Block` is a frame's columns decoded; rows come from it with one C ``zip``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import repeat
from operator import attrgetter
from typing import Any

from offbroadway import Message

from .values import pack, unpack

#: a row's fields, by name (the only place their positions are written down)
ORIGIN, TOKEN, ID, DATA, METADATA = range(5)
#: the data codecs: what a ``datas`` entry is
MSGPACK, BYTES = 0, 1
CODECS = (MSGPACK, BYTES)
#: the metadata of a message that has none
EMPTY_METADATA = pack({})



class EventsError(ValueError):
    """Packed events this module cannot accept (the frame is malformed)."""


# -- blocks: a frame's events, decoded ----------------------------------------------------

class Block:
    """The events of one frame as columns (each a list of the same length) and the codec of
    their data.  Slicing gives a block; indexing or iterating gives rows."""

    __slots__ = ("codec", "datas", "ids", "metas", "origins", "tokens")

    def __init__(self, codec: int, origins: list, tokens: list, ids: list, datas: list,
                 metas: list) -> None:
        self.codec = codec
        self.origins = origins
        self.tokens = tokens
        self.ids = ids
        self.datas = datas
        self.metas = metas

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, part: slice | int) -> Any:
        """A slice of the block, or one event's row."""
        if type(part) is int:
            return (self.origins[part], self.tokens[part], self.ids[part], self.datas[part],
                    self.metas[part])
        return Block(self.codec, self.origins[part], self.tokens[part], self.ids[part],
                     self.datas[part], self.metas[part])

    def __iter__(self) -> Iterator[tuple]:
        return zip(self.origins, self.tokens, self.ids, self.datas, self.metas)

    def rows(self) -> list[tuple]:
        return list(zip(self.origins, self.tokens, self.ids, self.datas, self.metas))

    def extend(self, other: Block) -> None:
        """Append ``other``'s events (of the same codec) in place: a batcher's partial batch
        grows by whole columns, never event by event."""
        if other.codec != self.codec:
            raise ValueError("blocks of two codecs cannot be joined")
        self.origins.extend(other.origins)
        self.tokens.extend(other.tokens)
        self.ids.extend(other.ids)
        self.datas.extend(other.datas)
        self.metas.extend(other.metas)

    def transcoded(self) -> Block:
        """This block with its data in the values codec (:data:`MSGPACK`): itself if it is."""
        if self.codec == MSGPACK:
            return self
        return Block(MSGPACK, self.origins, self.tokens, self.ids,
                     list(map(pack, self.datas)), self.metas)

    def columns(self) -> list:
        """The packed form of its columns (:func:`columns`)."""
        return columns(self.codec, self.origins, self.tokens, self.ids, self.datas,
                       self.metas)


def open_block(cols: Any) -> Block:
    """A frame's decoded columns, checked and expanded (C-speed checks over the columns,
    no Python step per event), else :class:`EventsError`."""
    if type(cols) is not list or len(cols) != 6:
        raise EventsError("events are not the six columns [codec, origins, tokens, ids, "
                          "datas, metas]")
    codec, origins, tokens, ids, datas, metas = cols
    if codec not in CODECS:
        raise EventsError(f"unknown data codec {codec!r}")
    if type(ids) is not list or type(datas) is not list or len(ids) != len(datas):
        raise EventsError("ids and datas are not two lists of one length")
    n = len(ids)
    if n and set(map(type, datas)) != {bytes}:
        raise EventsError("a message's data is not bytes")
    if type(origins) is int:
        origins = [origins] * n
    elif type(origins) is not list or len(origins) != n or (n and set(map(type, origins))
                                                             != {int}):
        raise EventsError("origins are not an int or a list of ints, one per event")
    if type(tokens) is int:
        tokens = list(range(tokens, tokens + n))
    elif type(tokens) is not list or len(tokens) != n or (n and set(map(type, tokens))
                                                           != {int}):
        raise EventsError("tokens are not an int or a list of ints, one per event")
    if type(metas) is bytes:
        metas = [metas] * n
    elif type(metas) is not list or len(metas) != n or (n and set(map(type, metas))
                                                         != {bytes}):
        raise EventsError("metas are not bytes or a list of bytes, one per event")
    return Block(codec, origins, tokens, ids, datas, metas)


def columns(codec: int, origins: Sequence[int], tokens: Sequence[int], ids: Sequence[Any],
            datas: Sequence[bytes], metas: Sequence[bytes]) -> list:
    """The packed form of a frame's columns: what all events share is said once (an
    origin, consecutive tokens, a metadata)."""
    n = len(ids)
    if n:
        first = origins[0]
        if origins.count(first) == n:
            origins = first
        first = tokens[0]
        if type(first) is int and tokens[-1] == first + n - 1 and (
                tokens == (list if type(tokens) is list else tuple)(range(first, first + n))):
            tokens = first
        first = metas[0]
        if metas.count(first) == n:
            metas = first
    return [codec, origins, tokens, ids, datas, metas]


def row_columns(rows: Sequence[Sequence[Any]], codec: int) -> list:
    """:func:`columns` of rows (one C ``zip`` to turn them)."""
    if not rows:
        return [codec, [], [], [], [], []]
    origins, tokens, ids, datas, metas = zip(*rows)
    return columns(codec, origins, tokens, list(ids), list(datas), metas)


def transcode(rows: list[tuple], codec: int) -> list[tuple]:
    """Rows of data in ``codec`` as rows of MSGPACK data (a stage that mixes events of
    several frames in one, the batcher, keeps one codec); MSGPACK rows as they are."""
    if codec == MSGPACK or not rows:
        return rows
    origins, tokens, ids, datas, metas = zip(*rows)
    return list(zip(origins, tokens, ids, map(pack, datas), metas))


# -- rows from a source's items -------------------------------------------------------------

def encode_items(items: Sequence[Sequence[Any]]
                 ) -> tuple[int, Sequence[Any], list[bytes], list[bytes], dict[int, str]]:
    """A fetch's ``(id, data, metadata, handle)`` items encoded once, for the whole trip:
    (the codec, the ids, each data, each metadata, the index of each item whose values the
    codec cannot carry -> why).  Bodies that are all bytes are not encoded at all
    (:data:`BYTES`); metadata every item shares (equal) is encoded once."""
    if not items:
        return MSGPACK, (), [], [], {}
    ids, datas, metas, _ = zip(*items)
    bad: dict[int, str] = {}
    if set(map(type, datas)) == {bytes}:
        codec, encoded = BYTES, list(datas)
    else:
        codec = MSGPACK
        try:
            encoded = list(map(pack, datas))
        except Exception:  # the codec raises TypeError, ValueError, OverflowError
            encoded = [_encode_or_note(d, i, "data", bad) for i, d in enumerate(datas)]
    first = metas[0]
    try:
        if metas.count(first) == len(metas):
            metas_out = [pack(first)] * len(metas)
        else:
            metas_out = list(map(pack, metas))
    except Exception:
        metas_out = [_encode_or_note(m, i, "metadata", bad) for i, m in enumerate(metas)]
    return codec, ids, encoded, metas_out, bad


def _encode_or_note(value: Any, i: int, where: str, bad: dict[int, str]) -> bytes:
    from .values import unpackable
    try:
        return pack(value)
    except Exception:
        bad.setdefault(i, unpackable(value, where) or f"its {where}")
        return pack(repr(value))


def new_rows(origin: int, first_token: int, ids: Sequence[Any], datas: Sequence[bytes],
             metas: Sequence[bytes]) -> list[tuple]:
    """Rows for a fetch's messages (their ids, the encoded ``datas`` and ``metas``), with
    tokens from ``first_token`` on: one C ``zip``, the producer's hot path."""
    return list(zip(repeat(origin), range(first_token, first_token + len(ids)), ids, datas,
                    metas))


# -- messages: built where user code runs ---------------------------------------------------

class _Unread:
    """The value of a data or metadata slot not decoded yet."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<not decoded>"

    def __reduce__(self) -> str:
        return "_UNREAD"     # one of it: a copied or pickled message still decodes on read


_UNREAD = _Unread()
_meta_raw = attrgetter("_meta_raw")
_get_data, _set_data = Message.data.__get__, Message.data.__set__          # type: ignore
_get_meta, _set_meta = Message.metadata.__get__, Message.metadata.__set__  # type: ignore


class WireMessage(Message):
    """A :class:`~offbroadway.Message` off the wire: ``data`` and ``metadata`` are decoded
    the first time something reads them, and a message whose data was never read goes on
    as the bytes it came with.  Users see a ``Message`` (it is one); only the runtime
    builds these."""

    __slots__ = ("_data_raw", "_meta_raw")
    #: the codec of ``_data_raw``
    codec = MSGPACK

    #: how ``_data_raw`` becomes the value (a C call: read once per message that is read)
    _decode = staticmethod(unpack)

    @property                      # type: ignore[override]
    def data(self) -> Any:
        v = _get_data(self)
        if v is _UNREAD:
            try:
                v = self._decode(self._data_raw)
            except Exception:
                v = _decoded(self._decode, self._data_raw, "data")    # raises, and says why
            _set_data(self, v)
        return v

    @data.setter
    def data(self, value: Any) -> None:
        _set_data(self, value)

    @property                      # type: ignore[override]
    def metadata(self) -> Any:
        v = _get_meta(self)
        if v is _UNREAD:
            v = _decoded(unpack, self._meta_raw, "metadata")
            _set_meta(self, v)
        return v

    @metadata.setter
    def metadata(self, value: Any) -> None:
        _set_meta(self, value)


def _decoded(decode: Any, raw: bytes, what: str) -> Any:
    """``decode(raw)``, or a ValueError that says which value did not decode (where a
    handler reads it, that fails the message alone)."""
    try:
        return decode(raw)
    except Exception as exc:  # msgspec and the extension types raise several types
        raise ValueError(f"the message's {what} does not decode: {type(exc).__name__}: "
                         f"{exc}") from None


class BytesMessage(WireMessage):
    """A message whose data is the bytes it travels as (a broker's body)."""

    __slots__ = ()
    codec = BYTES
    _decode = staticmethod(bytes)     # a body is its bytes (``bytes(b)`` is ``b``)


_MESSAGE_OF = {MSGPACK: WireMessage, BYTES: BytesMessage}


def to_messages(block: Block, status: str | None, batcher: str, batch_key: Any
                ) -> list[Message]:
    """Messages for user code from a block whose events share ``status``, ``batcher`` and
    ``batch_key``: slots set directly (about half of ``Message(...)`` with its keywords),
    values left encoded."""
    cls = _MESSAGE_OF[block.codec]
    new = object.__new__
    unread = _UNREAD
    out = []
    append = out.append
    for origin, token, msg_id, data, meta in zip(block.origins, block.tokens, block.ids,
                                                  block.datas, block.metas):
        m = new(cls)
        m.id = msg_id
        _set_data(m, unread)
        m._data_raw = data
        _set_meta(m, unread)
        m._meta_raw = meta
        m.batcher = batcher
        m.batch_key = batch_key
        m.status = status
        m._origin = origin
        m._token = token
        append(m)
    return out


def row_message(row: Sequence[Any], codec: int = MSGPACK, status: str | None = None
                ) -> Message:
    """One row as a message (routing functions that need one; not the hot path)."""
    return to_messages(Block(codec, [row[ORIGIN]], [row[TOKEN]], [row[ID]], [row[DATA]],
                             [row[METADATA]]), status, "default", "default")[0]


def message_columns(messages: Sequence[Message]) -> list:
    """The packed columns of messages going on to the next stage: a value nobody read is
    sent as the bytes it came with, one that was read (or set) is encoded again.  Raises
    what the codec raises for a value it cannot carry (the caller fails that message)."""
    datas = [m._data_raw if _get_data(m) is _UNREAD else None for m in messages]
    kinds = set(map(type, messages))
    codec = messages[0].codec if len(kinds) == 1 and kinds <= {WireMessage, BytesMessage} \
        else MSGPACK
    if codec != MSGPACK and None in datas:
        codec = MSGPACK
    if codec == MSGPACK and (None in datas or kinds != {WireMessage}):
        datas = [m._data_raw if (d is not None and m.codec == MSGPACK) else pack(m.data)
                 for m, d in zip(messages, datas)]
    metas = [m._meta_raw if _get_meta(m) is _UNREAD else pack(_get_meta(m))
             for m in messages]
    return columns(codec, [m._origin for m in messages], [m._token for m in messages],
                   [m.id for m in messages], datas, metas)


#: the bytes of a row besides its data, metadata and id in a byte budget (its envelope)
ROW_OVERHEAD = 16


def row_bytes(row: Sequence[Any]) -> int:
    """What a row costs a batcher's byte budget: its encoded data and metadata, its id, and
    the envelope's few bytes."""
    return len(row[DATA]) + len(row[METADATA]) + len(str(row[ID])) + ROW_OVERHEAD


def encode_rows(rows: Sequence[Sequence[Any]]) -> list[tuple]:
    """Rows of plain values (``(origin, token, id, data, metadata)``) as rows of encoded
    ones, in the values codec: for tests, benches and the rare path that builds events by
    hand."""
    return [(o, t, i, pack(d), pack(m)) for o, t, i, d, m in rows]


def _array_header(n: int) -> bytes:
    """msgpack's array header for ``n`` elements (fixarray, array 16 or array 32)."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def data_values(messages: Sequence[Message]) -> list[Any]:
    """Every message's ``data``, those nobody read yet decoded together in one C call (the
    batch processor's rows for Spark: a batch's data arrives encoded and is read once, all
    of it); each message keeps its value, as if it had been read one by one."""
    unread = [m._data_raw for m in messages
              if _get_data(m) is _UNREAD and m.codec == MSGPACK]
    if len(unread) != len(messages) or not unread:
        return [m.data for m in messages]
    try:
        values = unpack(_array_header(len(unread)) + b"".join(unread))
    except Exception:  # one of them does not decode: each is read alone, and raises
        return [m.data for m in messages]
    list(map(_set_data, messages, values))
    return values


def flagged(messages: Sequence[Message], key: str) -> list[Message]:
    """The messages whose metadata has ``key`` set to true (a broker's ``redelivered``).
    Metadata nobody read is looked at in its bytes first (one C search per message; it may
    find the key in a nested value, and that message is then decoded and read in full), so
    a batch of first deliveries decodes no metadata."""
    needle = pack(key) + pack(True)
    try:
        if (list(map(_get_meta, messages)).count(_UNREAD) == len(messages)
                and needle not in b"\0".join(map(_meta_raw, messages))):
            return []          # the usual batch: none read, and none says it, in one search
    except AttributeError:     # a message a handler built: looked at one by one below
        pass
    out = []
    for m in messages:
        if _get_meta(m) is _UNREAD and needle not in m._meta_raw:
            continue
        metadata = m.metadata
        if isinstance(metadata, dict) and metadata.get(key):
            out.append(m)
    return out
