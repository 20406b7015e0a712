"""The values a message carries across stages: msgpack plus a few extension types.

Besides msgpack's own types (None, bool, int, float, str, bytes, lists, maps; a tuple
travels as a list), the codec carries the values a handler commonly returns, as msgpack
extension types whose payload is plain text or bytes (never code):

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
any malformed frame.  Frames (:mod:`.protocol`) and each message's data and metadata
(:mod:`.events`) are encoded with this one codec.
"""

from __future__ import annotations

import datetime as _dt
from decimal import Decimal
from typing import Any
from uuid import UUID

import msgpack
import msgspec
from offbroadway import Message

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


#: the codec's encoder and decoder under their public names (stages encode a message's data
#: with these; nothing else packs or unpacks values)
pack = _pack
unpack = _unpack


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


def split_unsendable(messages: list[Message], onward: str
                     ) -> tuple[list[Message], list[Message]]:
    """(the messages whose values the codec carries, the others): each of the others is
    failed with what of it cannot cross and where it could not go (``onward``, e.g. "on to
    the batcher").  Only called once a frame of them failed to encode."""
    kept: list[Message] = []
    bad: list[Message] = []
    for m in messages:
        why = message_unpackable(m)
        if why is None:
            kept.append(m)
        else:
            m.status = f"{why}: it cannot be sent {onward}"
            bad.append(m)
    return kept, bad
