"""Hostile input to the decoder: random bytes, truncated frames, wrong shapes, huge frames.
The only outcomes allowed are a decoded message or ProtocolError; nothing else escapes."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from offbroadway.stages.wire import protocol

VALID = [protocol.subscribe(10, 5, None), protocol.ask(7),
         protocol.cancel(protocol.CANCEL_SHUTDOWN),
         protocol.ack([1, 2], [[3, "bad"]]), protocol.command("stop", {}),
         protocol.report("stats", {"in": 1}),
         protocol.events([[0, 1, "id", {"a": 1}, {}]]),
         protocol.batch("k", "size", protocol.split_events(
             protocol.decode(protocol.events([[0, 1, "id", {"a": 1}, {}]] * 3))[3]))]

msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text() |
    st.binary(),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(), inner, max_size=6),
    max_leaves=20)


def decode_or_refuse(frame: bytes) -> None:
    """The decoder, and for frames that carry events the two ways stages open them."""
    try:
        msg = protocol.decode(frame)
    except protocol.ProtocolError:
        return
    if msg[0] in (protocol.EVENTS, protocol.BATCH, protocol.RETURN):
        packed = msg[1] if msg[0] == protocol.RETURN else msg[3]
        for open_ in (protocol.open_events, protocol.split_events):
            try:
                open_(packed)
            except protocol.ProtocolError:
                pass


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes(frame: bytes) -> None:
    decode_or_refuse(frame)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(VALID), st.data())
def test_truncated_and_flipped_valid_frames(frame: bytes, data) -> None:
    cut = data.draw(st.integers(0, len(frame)))
    decode_or_refuse(frame[:cut])
    i = data.draw(st.integers(0, len(frame) - 1))
    flipped = bytearray(frame)
    flipped[i] ^= data.draw(st.integers(1, 255))
    decode_or_refuse(bytes(flipped))


@settings(max_examples=500, deadline=None)
@given(st.integers(-3, 20), msgpack_values, st.lists(msgpack_values, max_size=5))
def test_well_formed_msgpack_of_the_wrong_shape(kind: int, first, rest: list) -> None:
    frame = msgpack.packb([protocol.VERSION, kind, first, *rest], use_bin_type=True)
    decode_or_refuse(frame)


@settings(max_examples=500, deadline=None)
@given(st.lists(msgpack_values, max_size=5))
def test_packed_events_of_the_wrong_shape(events: list) -> None:
    decode_or_refuse(msgpack.packb([protocol.VERSION, protocol.EVENTS, None, "k",
                                    msgpack.packb(events, use_bin_type=True)],
                                   use_bin_type=True))


def test_split_events_round_trips_through_a_batch() -> None:
    evs = [[0, i, f"id-{i}", {"seq": i, "p": "x" * i}, {}] for i in range(40)]
    raw = protocol.split_events(protocol.decode(protocol.events(evs))[3])
    assert len(raw) == 40
    msg = protocol.decode(protocol.batch("k", "size", raw[5:25]))
    assert msg[1:3] == ["k", "size"]
    assert protocol.open_events(msg[3]) == evs[5:25]


def test_oversized_frame_is_refused_unread() -> None:
    with pytest.raises(protocol.ProtocolError, match="over the"):
        protocol.decode(b"\x00" * (protocol.MAX_FRAME_BYTES + 1))


def test_never_unpickles() -> None:
    import pickle

    with pytest.raises(protocol.ProtocolError):
        protocol.decode(pickle.dumps(["not", "for", "us"]))


def test_consecutive_acks_travel_as_one_range() -> None:
    first = 1_763_000_000_000_000_000
    tokens = list(range(first, first + 100))
    frame = protocol.ack(tokens, [[first + 200, "bad"]])
    assert len(frame) < 40
    msg = protocol.decode(frame)
    assert protocol.acked_tokens(msg[1]) == tokens and msg[2] == [[first + 200, "bad"]]
    gaps = [first, first + 2, first + 3]
    assert protocol.acked_tokens(protocol.decode(protocol.ack(gaps))[1]) == gaps


@settings(max_examples=300, deadline=None)
@given(st.lists(msgpack_values, max_size=8))
def test_acked_tokens_never_raises_nor_expands_past_the_bound(ok: list) -> None:
    out = protocol.acked_tokens(ok)
    assert len(out) <= len(ok) * protocol.MAX_ACK_RANGE
    huge = protocol.acked_tokens([[0, protocol.MAX_ACK_RANGE + 1]])
    assert huge == [[0, protocol.MAX_ACK_RANGE + 1]]
