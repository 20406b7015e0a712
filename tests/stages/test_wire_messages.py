"""Messages off the wire (:class:`~offbroadway.stages.wire.events.WireMessage`): values
decoded when read, the bytes a message came with sent on when nobody read them, and what a
handler changed sent as changed, whichever way it changed it."""

from __future__ import annotations

import copy
import pickle
from datetime import UTC, datetime
from decimal import Decimal

from offbroadway import Message
from offbroadway.stages.wire import events as ev
from offbroadway.stages.wire import protocol


def _messages(rows: list[tuple], codec: int = ev.MSGPACK) -> list[Message]:
    frame = protocol.decode(protocol.events(rows, codec=codec))
    return protocol.to_messages(protocol.open_events(frame[protocol.EVENTS_PACKED]))


def _onward(messages: list[Message]) -> ev.Block:
    """What the next stage receives of ``messages`` (a processor's output frame)."""
    frame = protocol.decode(protocol.message_events(messages, "k"))
    return protocol.open_events(frame[protocol.EVENTS_PACKED])


def test_unread_values_go_on_as_the_bytes_they_came_with() -> None:
    rows = ev.encode_rows([(0, 10 + i, f"m{i}", {"n": i, "when": datetime(2026, 1, i + 1,
                                                                       tzinfo=UTC)},
                            {"line": i}) for i in range(5)])
    block = _onward(_messages(rows))
    assert block.datas == [r[ev.DATA] for r in rows]
    assert block.metas == [r[ev.METADATA] for r in rows]
    assert block.tokens == [10, 11, 12, 13, 14] and block.codec == ev.MSGPACK


def test_what_a_handler_changes_is_sent_changed_however_it_changed_it() -> None:
    rows = ev.encode_rows([(0, i, f"m{i}", {"n": i}, {"k": i}) for i in range(4)])
    ms = _messages(rows)
    ms[0].data["n"] = 100                                    # in place, after a read
    ms[1].update_data(lambda d: {**d, "total": Decimal("1.50")})
    ms[2].metadata["seen"] = True
    ms[3] = Message(ms[3].id, ["built", "by", "the", "handler"])   # a message of its own
    ms[3]._origin, ms[3]._token = 0, 3
    again = protocol.to_messages(_onward(ms))
    assert [m.data for m in again] == [{"n": 100}, {"n": 1, "total": Decimal("1.50")},
                                       {"n": 2}, ["built", "by", "the", "handler"]]
    assert [m.metadata for m in again] == [{"k": 0}, {"k": 1}, {"k": 2, "seen": True}, {}]


def test_bodies_stay_bytes_and_a_frame_of_read_and_unread_ones_keeps_every_value() -> None:
    rows = [(0, i, f"m{i}", f"body {i}".encode(), ev.EMPTY_METADATA) for i in range(3)]
    ms = _messages(rows, ev.BYTES)
    assert [m.data for m in ms] == [b"body 0", b"body 1", b"body 2"]
    untouched = _messages(rows, ev.BYTES)
    assert _onward(untouched).codec == ev.BYTES          # sent on as they came
    ms[1].data = {"parsed": 1}
    block = _onward(ms)
    assert block.codec == ev.MSGPACK
    assert [m.data for m in protocol.to_messages(block)] == [b"body 0", {"parsed": 1},
                                                             b"body 2"]


def test_a_copied_or_pickled_message_still_decodes_on_read() -> None:
    [m] = _messages(ev.encode_rows([(0, 1, "m", {"n": 1}, {"k": 1})]))
    for other in (copy.copy(m), copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert other.data == {"n": 1} and other.metadata == {"k": 1}


def test_a_batch_decoded_at_once_is_what_each_read_gives() -> None:
    rows = ev.encode_rows([(0, i, f"m{i}", {"n": i, "s": "x" * i}, {}) for i in range(40)])
    together, alone = _messages(rows), _messages(rows)
    assert ev.data_values(together) == [m.data for m in alone]
    assert [m.data for m in together] == [m.data for m in alone]
    alone[3].data = "read and set"                          # not all unread: one by one
    assert ev.data_values(alone)[3] == "read and set"


def test_flagged_finds_the_key_in_the_metadata_and_not_in_a_nested_value() -> None:
    rows = ev.encode_rows([(0, 1, "a", 1, {"redelivered": True}),
                           (0, 2, "b", 2, {"redelivered": False}),
                           (0, 3, "c", 3, {"headers": {"redelivered": True}})])
    ms = _messages(rows)
    assert [m.id for m in ev.flagged(ms, "redelivered")] == ["a"]
