"""The rabbitmq source's delivery decoder (``frames.py``) without a broker: streams pika
itself encodes decode to what pika decodes, however the socket splits them, and malformed
streams end in one ``MalformedFrame`` (never another exception, never a loop)."""

from __future__ import annotations

import datetime
import decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from offbroadway.stages.sources.rabbitmq.delivery import item_of, to_item
from offbroadway.stages.sources.rabbitmq.frames import (
    DeliveryFrames,
    MalformedFrame,
    pika_frame_of,
)
from pika import frame, spec

CH = 1

text = st.text(max_size=20)
props_st = st.builds(
    spec.BasicProperties,
    content_type=st.none() | text, message_id=st.none() | text | st.binary(max_size=8),
    content_encoding=st.none() | text, correlation_id=st.none() | text,
    reply_to=st.none() | text, expiration=st.none() | text, type=st.none() | text,
    user_id=st.none() | text, app_id=st.none() | text, cluster_id=st.none() | text,
    delivery_mode=st.none() | st.sampled_from([1, 2]),
    priority=st.none() | st.integers(0, 9), timestamp=st.none() | st.integers(0, 2**40),
    headers=st.none() | st.dictionaries(
        st.text(min_size=1, max_size=10),
        st.integers(-2**40, 2**40) | text | st.booleans() | st.none()
        | st.binary(max_size=10)
        | st.datetimes(datetime.datetime(1970, 1, 2), datetime.datetime(2100, 1, 1)).map(
            lambda d: d.replace(microsecond=0))
        | st.decimals(-10**6, 10**6, places=2)
        | st.lists(st.integers(0, 9) | text, max_size=3), max_size=8))
#: up to ~19 KB: several body frames at the smallest frame_max AMQP allows (4096)
body_st = st.tuples(st.binary(max_size=32), st.integers(0, 600)).map(lambda t: t[0] * t[1])
delivery_st = st.tuples(st.integers(1, 2**63 - 1), st.booleans(), text, text,
                        st.none() | props_st, body_st)


def encode(deliveries: list, frame_max: int, noise: bool = True) -> bytes:
    """Deliveries as a broker sends them (pika's own encoders), body frames cut at
    ``frame_max``, with a heartbeat and another channel's method between them."""
    out = []
    room = frame_max - 8
    for tag, redelivered, exchange, routing_key, props, body in deliveries:
        out.append(frame.Method(CH, spec.Basic.Deliver("ctag", tag, redelivered, exchange,
                                                       routing_key)).marshal())
        out.append(frame.Header(CH, len(body), props or spec.BasicProperties()).marshal())
        for i in range(0, len(body), room):
            out.append(frame.Body(CH, body[i:i + room]).marshal())
        if noise:
            out.append(frame.Heartbeat().marshal())
            out.append(frame.Method(2, spec.Basic.QosOk()).marshal())
    return b"".join(out)


def run(stream: bytes, cuts: list[int], frame_max: int) -> tuple[list, list]:
    got: list = []
    others: list = []
    dec = DeliveryFrames(CH, frame_max, lambda *d: got.append(d),
                         lambda raw: others.append(pika_frame_of(raw)))
    prev = 0
    for cut in [*sorted({c % (len(stream) + 1) for c in cuts}), len(stream)]:
        dec.feed(stream[prev:cut])
        prev = cut
    return got, others


def same_item(d: tuple, props: Any, body: bytes) -> None:
    """The decoder's delivery makes the item pika's objects make (metadata exactly)."""
    tag, redelivered, exchange, routing_key, got_props, got_body = d
    assert got_body == body
    ours = item_of(tag, redelivered, exchange, routing_key, got_props, got_body, "q", 1,
                   "s", 1 << 20)
    method = spec.Basic.Deliver("ctag", tag, redelivered, exchange, routing_key)
    # pika's own reading of the same header frame (b"" comes back as "", as on the wire)
    header = frame.Header(CH, len(body), props or spec.BasicProperties()).marshal()
    pikas = to_item(method, pika_frame_of(header).properties, body, "q", 1, "s", 1 << 20)
    assert ours == pikas


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(delivery_st, max_size=6), st.integers(4096, 9000),
       st.lists(st.integers(0, 10**6), max_size=12))
def test_pikas_stream_decodes_as_pika_does_however_it_is_split(
        deliveries: list, frame_max: int, cuts: list[int]) -> None:
    got, others = run(encode(deliveries, frame_max), cuts, frame_max)
    assert len(got) == len(deliveries)
    for d, (*_, props, body) in zip(got, deliveries, strict=True):
        same_item(d, props, body)
    assert len(others) == 2 * len(deliveries)
    assert all(isinstance(o, frame.Heartbeat) or o.channel_number == 2 for o in others)


def test_large_headers_and_every_property() -> None:
    headers = {f"h{i}": "x" * 50 for i in range(1500)}
    headers.update({"when": datetime.datetime(2026, 1, 2, 3, 4, 5), "n": 2**62,
                    "d": decimal.Decimal("3.14"), "t": {"inner": [1, "a", b"b"]}})
    props = spec.BasicProperties(
        content_type="application/json", content_encoding="gzip", headers=headers,
        delivery_mode=2, priority=5, correlation_id="c", reply_to="r", expiration="60000",
        message_id="m-1", timestamp=1_700_000_000, type="t", user_id="guest", app_id="a",
        cluster_id="cl")
    body = bytes(range(256)) * 2000           # 512 KB: four body frames at 128 KB
    frame_max = 131072
    got, _ = run(encode([(7, True, "ex", "rk", props, body)], frame_max), [1, 9000, 200003],
                 frame_max)
    assert len(got) == 1
    same_item(got[0], props, body)
    meta = item_of(*got[0], "q", 1, "s", 1 << 20)[2]
    assert meta["headers"]["when"] == 1767323045 and meta["headers"]["d"] == "3.14"
    assert meta["message_id"] == "m-1" and meta["redelivered"] is True


def reframe(stream: bytes, at: int, junk: bytes, keep: bool) -> bytes:
    """One frame's payload replaced (``junk``) or cut short (``keep``: its first
    ``len(junk)`` bytes), its size field and end marker made to match: a frame that is
    well framed and wrong inside."""
    frames, pos = [], 0
    while pos < len(stream):
        size = int.from_bytes(stream[pos + 3:pos + 7], "big")
        frames.append(stream[pos:pos + size + 8])
        pos += size + 8
    k = at % len(frames)
    old = frames[k]
    payload = old[7:-1][:len(junk)] if keep else junk
    frames[k] = old[:3] + len(payload).to_bytes(4, "big") + payload + b"\xce"
    return b"".join(frames)


def mutate(stream: bytes, how: int, at: int, junk: bytes) -> bytes:
    if how >= 4:
        return reframe(stream, at, junk, how == 4)
    at %= len(stream)
    if how == 0:                                   # a byte changed
        return stream[:at] + bytes([stream[at] ^ (junk[0] if junk else 0xFF) or 1]) \
            + stream[at + 1:]
    if how == 1:                                   # bytes inserted
        return stream[:at] + junk + stream[at:]
    if how == 2:                                   # bytes lost
        return stream[:at] + stream[at + 1 + len(junk):]
    return stream[:at] + junk                      # the rest replaced


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(delivery_st, min_size=1, max_size=4), st.integers(4096, 9000),
       st.integers(0, 5), st.integers(0, 10**6), st.binary(min_size=1, max_size=40),
       st.lists(st.integers(0, 10**6), max_size=6))
def test_a_malformed_stream_ends_in_one_clear_error(
        deliveries: list, frame_max: int, how: int, at: int, junk: bytes,
        cuts: list[int]) -> None:
    stream = mutate(encode(deliveries, frame_max), how, at, junk)
    try:
        run(stream, cuts, frame_max)
    except MalformedFrame as exc:
        line = str(exc)
        assert line.startswith("malformed AMQP frame") and "\n" not in line
    # otherwise the change was one no frame check can see (a body byte), or it left a
    # partial frame waiting for bytes a broker would send: both end normally


@pytest.mark.parametrize(("stream", "words"), [
    (b"\x01\x00\x01\x00\x00\x00\x04\x00\x3c\x00\x3c\x00", "frame-end"),
    (b"\x09\x00\x01\x00\x00\x00\x00\xce", "unknown frame type 9"),
    (b"\x01\x00\x01\x7f\xff\xff\xff", "over the negotiated frame_max"),
    (frame.Header(CH, 3, spec.BasicProperties()).marshal(), "where basic.deliver was due"),
    (frame.Method(CH, spec.Basic.Deliver("c", 1, False, "e", "r")).marshal()
     + frame.Body(CH, b"abc").marshal(), "where a content header was due"),
    (frame.Method(CH, spec.Basic.Deliver("c", 1, False, "e", "r")).marshal()
     + frame.Header(CH, 2, spec.BasicProperties()).marshal()
     + frame.Body(CH, b"abc").marshal(), "carry 3 bytes, its header said 2"),
    (b"\x01\x00\x02\x00\x00\x00\x04\x00\x63\x00\x63\xce", "KeyError"),
])
def test_each_malformation_names_itself(stream: bytes, words: str) -> None:
    with pytest.raises(MalformedFrame, match=words):
        run(stream, [], 131072)
