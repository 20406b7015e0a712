"""The public ``Message``: the envelope is the runtime's, yet a program that moves
messages itself keeps the constructor and the read-only names it always had."""

from __future__ import annotations

import pytest
from offbroadway import Message
from offbroadway.stages.wire import protocol


def test_a_handler_built_message_has_the_empty_envelope() -> None:
    m = Message("a", {"x": 1})
    assert (m.origin, m.token) == (0, 0) == protocol.envelope_of(m)


def test_a_program_of_its_own_gives_and_reads_the_envelope() -> None:
    """The lean pipeline beside the benchmarks builds ``Message(id, data, None, token=t)``
    and acks ``m.token``: that keeps working, and the codec reads the same envelope."""
    m = Message("a", {}, None, batcher="b", origin=2, token=7)
    assert (m.origin, m.token, m.batcher) == (2, 7, "b")
    assert protocol.envelope_of(m) == (2, 7)
    assert (protocol.address(m, 3, 9).origin, m.token) == (3, 9)


def test_the_envelope_is_read_only_to_user_code() -> None:
    m = Message("a", {})
    with pytest.raises(AttributeError):
        m.token = 5          # type: ignore[misc]
    with pytest.raises(AttributeError):
        m.origin = 1         # type: ignore[misc]
