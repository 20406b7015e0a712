"""The frame: ``[VERSION, KIND, *fields]``, one msgpack array per ZeroMQ message part.

This module is the frame format and nothing else: the version, the size limit, every kind
and its arity (numbered here once, so two kinds never share a number), the field types
each kind must have, and :func:`decode`, which checks all of them before any stage reads
a field.  A malformed, unknown or oversized frame is a :class:`ProtocolError` that the
receiving loop counts, logs and drops.  What each kind carries, and its encoder, is its
own module's: :mod:`.subscription` (GenStage's subscription and demand), :mod:`.delivery`
(events, batches and acks), :mod:`.handoff` (the Spark hand-off), :mod:`.commands` (the
daemon's commands and the stages' reports).  msgpack, never pickle: a peer must not be
able to make another stage run code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import zmq

from .values import _pack, _unpack

#: 3: events travel as columns, their data and metadata encoded once at the producer
VERSION = 3
#: Frames larger than this are refused unread (64 MiB: a batch of 100k rows of ~600 B).
MAX_FRAME_BYTES = 64 * 1024 * 1024

#: positions in a decoded frame (:func:`decode` returns ``[kind, *fields]``): stages read
#: fields by these names, never by number (each kind's are in the module that carries it)
KIND_AT = 0
#: the one field of ASK, RETRACT, RETRACTED (n, k) and CANCEL (reason)
VALUE = 1

#: zmq.EVENTS and zmq.POLLIN as plain ints: readiness is checked before every read, and
#: pyzmq's enum flags cost microseconds per operation
ZMQ_EVENTS = int(zmq.EVENTS)
ZMQ_POLLIN = int(zmq.POLLIN)

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
DRAINED = 17

#: kind -> number of fields after [VERSION, KIND]
_ARITY = {SUBSCRIBE: 4, ASK: 1, EVENTS: 3, CANCEL: 1, ACK: 2, BATCH: 3, SUBSCRIBED: 2,
          RETRACT: 1, RETRACTED: 1, RETURN: 1, COMMAND: 2, REPORT: 2, HELLO: 0, SCHEMA: 3,
          COMMIT: 5, RESULT: 3, DRAINED: 0}
KIND_NAMES = {SUBSCRIBE: "subscribe", ASK: "ask", EVENTS: "events", CANCEL: "cancel",
              ACK: "ack", BATCH: "batch", SUBSCRIBED: "subscribed", RETRACT: "retract",
              RETRACTED: "retracted", RETURN: "return", COMMAND: "command", REPORT: "report",
              HELLO: "hello", SCHEMA: "schema", COMMIT: "commit", RESULT: "result",
              DRAINED: "drained"}


class ProtocolError(ValueError):
    """A frame this protocol cannot accept; the receiver counts it and drops it."""


def frame(*parts: Any) -> bytes:
    """A frame of ``parts`` (its kind, then its fields): the one way frames are built."""
    return _pack([VERSION, *parts])


def frames_within_limit(items: list, encode: Callable[[list], bytes]
                        ) -> list[tuple[bytes, list]]:
    """``encode(items)`` as one frame, or as several (each with the items it carries) when
    one would be over :data:`MAX_FRAME_BYTES`: the receiver would drop it, and the events
    in it would stay in flight forever, a stall.  Halving costs a re-encode only when a
    frame is too big.  A single event over the limit goes alone: preventing it is the
    sender's job (sources fail messages over ``max_message_bytes``)."""
    encoded = encode(items)
    if len(encoded) <= MAX_FRAME_BYTES or len(items) <= 1:
        return [(encoded, items)]
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
