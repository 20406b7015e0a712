"""Hostile input to the decoder: random bytes, truncated frames, wrong shapes, huge frames.
The only outcomes allowed are a decoded message or ProtocolError; nothing else escapes."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from offbroadway.stages.wire import events as ev
from offbroadway.stages.wire import protocol

VALID = [protocol.subscribe(10, 5, None), protocol.ask(7),
         protocol.cancel(protocol.CANCEL_SHUTDOWN),
         protocol.ack([1, 2], [[3, "bad"]]), protocol.command("stop", {}),
         protocol.report("stats", {"in": 1}),
         protocol.events(ev.encode_rows([[0, 1, "id", {"a": 1}, {}]])),
         protocol.batch("k", "size", ev.encode_rows([[0, 1, "id", {"a": 1}, {}]] * 3))]

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
        try:
            block = protocol.open_events(packed)
        except protocol.ProtocolError:
            return
        # what the stages do with a block: rows, messages (values stay encoded until read)
        assert len(block.rows()) == len(protocol.to_messages(block)) == len(block)


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


def test_rows_round_trip_through_a_batch_with_their_data_untouched() -> None:
    """The batcher's path: a frame's rows regrouped into a batch, each message's data the
    very bytes it came with, and its values what the producer encoded."""
    rows = ev.encode_rows([(0, i, f"id-{i}", {"seq": i, "p": "x" * i}, {"n": i % 3})
                           for i in range(40)])
    block = protocol.open_events(protocol.decode(protocol.events(rows))[3])
    assert block.rows() == rows
    msg = protocol.decode(protocol.batch("k", "size", block.rows()[5:25]))
    assert msg[1:3] == ["k", "size"]
    again = protocol.open_events(msg[3])
    assert again.rows() == rows[5:25]
    messages = protocol.to_messages(again)
    assert [m.data for m in messages] == [{"seq": i, "p": "x" * i} for i in range(5, 25)]
    assert [m.metadata for m in messages] == [{"n": i % 3} for i in range(5, 25)]


def test_shared_fields_are_said_once_and_read_back_per_event() -> None:
    """An origin, consecutive tokens and a metadata that every event shares are sent once;
    tokens that are not consecutive, and differing origins, travel as lists."""
    same = ev.encode_rows([(3, 100 + i, f"m{i}", i, {"p": 3}) for i in range(5)])
    cols = ev.row_columns(same, ev.MSGPACK)
    assert cols[1] == 3 and cols[2] == 100 and type(cols[5]) is bytes
    mixed = ev.encode_rows([(i % 2, 7 * i, f"m{i}", i, {"i": i}) for i in range(5)])
    cols = ev.row_columns(mixed, ev.MSGPACK)
    assert list(cols[1]) == [0, 1, 0, 1, 0] and list(cols[2]) == [0, 7, 14, 21, 28]
    for rows in (same, mixed):
        assert protocol.open_events(protocol.decode(protocol.events(rows))[3]).rows() == rows


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
