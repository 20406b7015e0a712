"""A decoder for the three frames of a delivery (``basic.deliver``, content header, body),
put in front of pika's frame handling on the consuming channel.

Why.  pika decodes every frame into generic objects (a ``Method`` frame around a
``Basic.Deliver``, a ``Header`` around ``BasicProperties``, a ``Body``), runs them through
its content assembler, its channel's consumer table and the ``BlockingChannel``'s event
queue before our callback sees a delivery: about 14 µs of this source's CPU per message,
where the bytes of a delivery need a few ``struct`` reads.  Here the socket's bytes are
split into frames once; the frames of deliveries on the consuming channel are parsed in
place and handed to ``on_delivery``; every other frame (the handshake is over when this is
installed: ``basic.qos``, cancels, the probe's channel, heartbeats, ``connection.close``)
goes to pika as it was, in order, through ``on_other``.  Properties, when a publisher set
any, are read as pika's ``BasicProperties.decode`` reads them (its table decoder for the
headers), into a dict by name, so metadata is exactly what pika's objects gave.

A frame this decoder cannot make sense of (a wrong end marker, a frame bigger than the
negotiated ``frame_max``, an unknown frame type, a content frame out of sequence, a body
longer than its header said, a truncated field) raises one :class:`MalformedFrame` naming
what was wrong; the connection is then dropped and the source reconnects, and the broker
redelivers whatever was not acked.

Pure: bytes in, callbacks out; :mod:`.connection` wires it to pika
(:func:`install`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pika.exceptions as amqp_errors
from pika import data as pika_data
from pika import frame as pika_frame
from pika import spec

_HEAD = struct.Struct(">BHI")
_TAG = struct.Struct(">QB")
_CONTENT = struct.Struct(">HHQH")
_DELIVER = b"\x00\x3c\x00\x3c"      # class 60 (basic), method 60 (deliver)
_FRAME_END = 0xCE
_METHOD, _HEADER, _BODY, _HEARTBEAT = 1, 2, 3, 8
_KNOWN_TYPES = frozenset({_METHOD, _HEADER, _BODY, _HEARTBEAT})
_BASIC = 60

#: on_delivery(delivery_tag, redelivered, exchange, routing_key, properties (a dict by
#: name) or None, body)
OnDelivery = Callable[[int, bool, Any, Any, Any, bytes], None]


class MalformedFrame(amqp_errors.AMQPConnectionError):
    """The broker sent bytes that are not a valid frame: the connection cannot go on."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "malformed AMQP frame"


#: basic's properties in wire order: name, flag bit, kind (s: short string, t: table,
#: o: octet, q: 64-bit integer), as pika's ``BasicProperties.decode`` reads them
_PROPERTIES = (("content_type", 0x8000, "s"), ("content_encoding", 0x4000, "s"),
               ("headers", 0x2000, "t"), ("delivery_mode", 0x1000, "o"),
               ("priority", 0x0800, "o"), ("correlation_id", 0x0400, "s"),
               ("reply_to", 0x0200, "s"), ("expiration", 0x0100, "s"),
               ("message_id", 0x0080, "s"), ("timestamp", 0x0040, "q"),
               ("type", 0x0020, "s"), ("user_id", 0x0010, "s"), ("app_id", 0x0008, "s"),
               ("cluster_id", 0x0004, "s"))
_Q = struct.Struct(">Q")


def decode_properties(enc: bytes) -> dict[str, Any]:
    """The properties a publisher set, by name, with pika's values (its table decoder for
    ``headers``, its rule for short strings): what ``BasicProperties.decode`` gives,
    without building the object.  A second flag word (no basic property uses it) goes to
    pika's decoder."""
    flags = (enc[0] << 8) | enc[1]
    if flags & 1:
        props = spec.BasicProperties()
        props.decode(enc)
        return {k: v for k, v in vars(props).items() if v is not None}
    out: dict[str, Any] = {}
    pos = 2
    for name, bit, kind in _PROPERTIES:
        if flags & bit:
            if kind == "s":
                out[name], pos = _shortstr(enc, pos)
            elif kind == "t":
                out[name], pos = pika_data.decode_table(enc, pos)
            elif kind == "o":
                out[name] = enc[pos]
                pos += 1
            else:
                out[name] = _Q.unpack_from(enc, pos)[0]
                pos += 8
    return out


def _shortstr(buf: bytes, pos: int) -> tuple[Any, int]:
    """An AMQP short string as pika gives it: ``str`` if UTF-8, else the bytes."""
    length = buf[pos]
    pos += 1
    end = pos + length
    if end > len(buf):
        raise ValueError("short string runs past the frame")
    raw = buf[pos:end]
    try:
        return raw.decode(), end
    except UnicodeDecodeError:
        return raw, end


class DeliveryFrames:
    """Splits a byte stream into frames; parses deliveries on ``channel``.

    ``frame_max`` bounds a frame (header and end marker included), so a corrupt size
    field is an error at once rather than a wait for gigabytes that never come.
    """

    __slots__ = (
        "_fragments",
        "_method",
        "_props",
        "_rest",
        "_seen",
        "_size",
        "_state",
        "channel",
        "delivered",
        "frame_max",
        "frames",
        "on_delivery",
        "on_other",
    )

    def __init__(self, channel: int, frame_max: int, on_delivery: OnDelivery,
                 on_other: Callable[[bytes], None]) -> None:
        self.channel = channel
        self.frame_max = frame_max
        self.on_delivery = on_delivery
        self.on_other = on_other
        self._rest = b""
        self._state = 0            # 0: between deliveries, 1: header next, 2: body next
        self._method: tuple[int, bool, Any, Any] | None = None
        self._props: Any = None
        self._size = self._seen = 0
        self._fragments: list[bytes] = []
        #: frames this decoder consumed itself, and the deliveries it completed
        self.frames = self.delivered = 0

    def take_over(self, pending: bytes) -> None:
        """Bytes pika had buffered but not parsed yet: they come first."""
        self._rest = pending + self._rest

    def feed(self, data: bytes) -> None:
        """Consume ``data``; complete frames are dispatched in order, a partial one kept."""
        buf = self._rest + data if self._rest else data
        n = len(buf)
        pos = 0
        unpack = _HEAD.unpack_from
        ours = self.channel
        frame_max = self.frame_max
        try:
            while n - pos >= 7:
                ftype, ch, size = unpack(buf, pos)
                if size + 8 > frame_max:
                    raise MalformedFrame(
                        f"malformed AMQP frame: type {ftype} on channel {ch} says {size} "
                        f"bytes, over the negotiated frame_max {frame_max}")
                end = pos + 7 + size
                if end >= n:
                    break
                if buf[end] != _FRAME_END:
                    raise MalformedFrame(
                        f"malformed AMQP frame: type {ftype} on channel {ch} ({size} bytes) "
                        f"does not end with the frame-end marker")
                if ftype not in _KNOWN_TYPES:
                    raise MalformedFrame(f"malformed AMQP frame: unknown frame type {ftype} "
                                         f"on channel {ch}")
                if ch == ours and (self._state or ftype != _METHOD
                                   or buf[pos + 7:pos + 11] == _DELIVER):
                    self._ours(ftype, buf, pos + 7, end)
                    self.frames += 1
                    pos = end + 1
                else:
                    frame = buf[pos:end + 1]
                    pos = end + 1
                    self.on_other(frame)
        finally:
            self._rest = buf[pos:] if pos < n else b""

    def _ours(self, ftype: int, buf: bytes, start: int, end: int) -> None:
        state = self._state
        if state == 2 and ftype == _BODY:
            self._fragments.append(buf[start:end])
            self._seen += end - start
            if self._seen >= self._size:
                if self._seen > self._size:
                    raise MalformedFrame(
                        f"malformed AMQP frame: a delivery's body frames on channel "
                        f"{self.channel} carry {self._seen} bytes, its header said "
                        f"{self._size}")
                frags = self._fragments
                body = frags[0] if len(frags) == 1 else b"".join(frags)
                self._finish(body)
            return
        if state == 0 and ftype == _METHOD:
            try:
                _consumer_tag, p = _shortstr(buf, start + 4)
                tag, bits = _TAG.unpack_from(buf, p)
                exchange, p = _shortstr(buf, p + 9)
                routing_key, p = _shortstr(buf, p)
            except (ValueError, IndexError, struct.error) as exc:
                raise MalformedFrame(f"malformed AMQP frame: basic.deliver on channel "
                                     f"{self.channel}: {exc}") from None
            if p > end:
                raise MalformedFrame(f"malformed AMQP frame: basic.deliver on channel "
                                     f"{self.channel} runs past its frame")
            self._method = (tag, bool(bits & 1), exchange, routing_key)
            self._state = 1
            return
        if state == 1 and ftype == _HEADER:
            if end - start < 14:
                raise MalformedFrame(f"malformed AMQP frame: content header on channel "
                                     f"{self.channel} is {end - start} bytes")
            class_id, _weight, size, flags = _CONTENT.unpack_from(buf, start)
            if class_id != _BASIC:
                raise MalformedFrame(f"malformed AMQP frame: content header of class "
                                     f"{class_id} after basic.deliver on channel "
                                     f"{self.channel}")
            props = None
            if flags:
                try:
                    props = decode_properties(buf[start + 12:end])
                except Exception as exc:   # pika's decoder: struct, index, unicode errors
                    raise MalformedFrame(
                        f"malformed AMQP frame: content header properties on channel "
                        f"{self.channel}: {exc.__class__.__name__}: {exc}") from None
            self._props = props
            self._size = size
            if size == 0:
                self._finish(b"")
            else:
                self._seen = 0
                self._fragments = []
                self._state = 2
            return
        want = ("basic.deliver", "a content header", "a body frame")[state]
        got = {_METHOD: "a method frame", _HEADER: "a content header", _BODY: "a body frame",
               _HEARTBEAT: "a heartbeat"}[ftype]
        raise MalformedFrame(f"malformed AMQP frame: {got} on channel {self.channel} "
                             f"where {want} was due")

    def _finish(self, body: bytes) -> None:
        method, props = self._method, self._props
        self._state = 0
        self._method = self._props = None
        self._fragments = []
        assert method is not None
        tag, redelivered, exchange, routing_key = method
        self.delivered += 1
        self.on_delivery(tag, redelivered, exchange, routing_key, props, body)


def pika_frame_of(raw: bytes) -> Any:
    """One complete frame decoded by pika, for pika to process; what pika's decoder
    cannot read (an unknown method, a truncated field) is a :class:`MalformedFrame`."""
    try:
        _consumed, value = pika_frame.decode_frame(raw)
    except Exception as exc:     # InvalidFrameError, KeyError (unknown method), struct.error
        ftype, ch = raw[0], int.from_bytes(raw[1:3], "big")
        raise MalformedFrame(f"malformed AMQP frame: type {ftype} on channel {ch}: "
                             f"{exc.__class__.__name__}: {exc}") from None
    if value is None:
        raise MalformedFrame("malformed AMQP frame: pika found it incomplete")
    return value


def install(conn: Any, channel_number: int, on_delivery: OnDelivery) -> DeliveryFrames:
    """Put a :class:`DeliveryFrames` in front of the frame handling of ``conn``, an open
    pika ``BlockingConnection``.  A read that completed deliveries ends the current
    ``process_data_events`` pass, as pika's own dispatch of a delivery does, so the
    caller hands them on without waiting for its time limit.  pika reads the socket and
    calls ``_on_data_available`` by attribute, so an instance attribute takes its place;
    frames that are not ours are decoded and processed by pika's own functions.  A
    :class:`MalformedFrame` drops the connection through pika's own path for a lost
    stream (the error is what the blocking connection raises), and bytes after it are
    ignored."""
    impl = conn._impl
    process = impl._process_frame
    end_pass = conn._request_channel_dispatch
    broken: list[BaseException] = []

    def other(raw: bytes) -> None:
        process(pika_frame_of(raw))

    frames = DeliveryFrames(channel_number, impl.params.frame_max or 131072, on_delivery,
                            other)
    frames.take_over(impl._frame_buffer)
    impl._frame_buffer = b""

    def on_data_available(data: bytes) -> None:
        if broken:
            return
        before = frames.frames
        delivered = frames.delivered
        try:
            frames.feed(data)
        except MalformedFrame as exc:
            broken.append(exc)
            impl._terminate_stream(exc)
        finally:
            # pika's heartbeat checker watches bytes_received
            impl.frames_received += frames.frames - before
            impl.bytes_received += len(data)
            if frames.delivered != delivered:
                end_pass(-channel_number)

    impl._on_data_available = on_data_available
    return frames
