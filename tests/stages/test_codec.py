"""The wire codec's values: what a handler commonly returns round-trips with its type,
anything else is named precisely, and a hostile extension payload is a malformed frame."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st
from offbroadway import Message
from offbroadway.stages.wire import events as ev
from offbroadway.stages.wire import protocol

#: fixed UTC offsets: a zone of the tz database travels as its offset (see below)
OFFSETS = st.builds(lambda m: dt.timezone(dt.timedelta(minutes=m)), st.integers(-1439, 1439))
LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=False),
    st.text(), st.binary(), st.dates(), st.uuids(), st.decimals(allow_nan=False),
    # ``fold`` (which of two repeated wall times) is not carried: ISO 8601 has no field
    st.datetimes(timezones=st.none() | OFFSETS).map(lambda d: d.replace(fold=0)),
    st.times(timezones=st.none() | OFFSETS).map(lambda t: t.replace(fold=0)),
)
VALUES = st.recursive(LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)),
    max_leaves=20)


def _roundtrip(value: object) -> object:
    frame = protocol.events(ev.encode_rows([[0, 1, "id", value, {}]]))
    block = protocol.open_events(protocol.decode(frame)[protocol.EVENTS_PACKED])
    return protocol.to_messages(block)[0].data


@given(VALUES)
def test_values_round_trip_with_their_type(value: object) -> None:
    back = _roundtrip(value)
    assert back == value and repr(back) == repr(value)


@given(st.datetimes(timezones=st.timezones(), allow_imaginary=False))
def test_a_datetime_in_a_tz_database_zone_keeps_its_instant_and_offset(value: dt.datetime
                                                                       ) -> None:
    back = _roundtrip(value)
    # (compared as instants: Python says False for ambiguous times of different zones)
    assert back.timestamp() == value.timestamp() and back.utcoffset() == value.utcoffset()


def test_a_zoned_datetime_keeps_its_offset_and_a_naive_one_stays_naive() -> None:
    zone = dt.timezone(dt.timedelta(hours=-3, minutes=-30))
    zoned, naive = _roundtrip([dt.datetime(2024, 1, 1, 12, tzinfo=zone),
                               dt.datetime(2024, 1, 1, 12)])
    assert zoned.utcoffset() == dt.timedelta(hours=-3, minutes=-30)
    assert naive.tzinfo is None
    assert type(_roundtrip(dt.date(2024, 1, 1))) is dt.date
    assert _roundtrip(Decimal("NaN")).is_nan()
    assert _roundtrip(uuid.UUID(int=7)) == uuid.UUID(int=7)


@pytest.mark.parametrize("value, where", [
    ({"a": [1, {2}]}, "data['a'][1] is a set"),
    ({"n": 2**70}, "data['n'] is an int out of the wire's 64-bit range"),
    ({"o": object()}, "data['o'] is a object"),
    ({"t": (1, frozenset())}, "data['t'][1] is a frozenset"),
    ({frozenset(): 1}, "a key of data (frozenset()) is a frozenset"),
])
def test_what_the_codec_cannot_carry_is_named(value: object, where: str) -> None:
    assert protocol.unpackable(value, "data").startswith(where)
    m = Message("m-1", value)
    assert protocol.message_unpackable(m).startswith(where)
    assert protocol.message_unpackable(Message("m-2", {"fine": dt.date.today()})) is None


@pytest.mark.parametrize("code, payload", [
    (protocol.EXT_DATETIME, b"not a time"), (protocol.EXT_DECIMAL, b"1.2.3"),
    (protocol.EXT_UUID, b"short"), (protocol.EXT_DATE, b"\xff\xfe"),
])
def test_a_bad_extension_payload_fails_the_read_of_that_data(code: int, payload: bytes
                                                              ) -> None:
    """Data travels encoded and is decoded where it is read: a payload that does not parse
    raises there (in a handler, that fails the message alone: the stage goes on)."""
    data = msgpack.packb(msgpack.ExtType(code, payload))
    packed = msgpack.packb([ev.MSGPACK, 0, 1, ["id", "ok"], [data, msgpack.packb(1)],
                            msgpack.packb({})])
    bad, ok = protocol.to_messages(protocol.open_events(packed))
    with pytest.raises(ValueError, match="does not decode"):
        _ = bad.data
    assert ok.data == 1


def test_an_unknown_extension_code_stays_an_ext_type() -> None:
    data = msgpack.packb(msgpack.ExtType(99, b"x"))
    packed = msgpack.packb([ev.MSGPACK, 0, 1, ["id"], [data], msgpack.packb({})])
    assert protocol.to_messages(protocol.open_events(packed))[0].data == \
        msgpack.ExtType(99, b"x")
