"""Messages on the wire and their acknowledgement: the EVENTS, RETURN, BATCH and ACK frames.

=============  ====================  ====================================================
kind           direction             fields
=============  ====================  ====================================================
EVENTS         producer → consumer   status, batch_key, events (packed): many per frame
RETURN         consumer → producer   events (packed) it received and will not start soon
                                     (long jobs that arrived together): back to the buffer
BATCH          batcher → batch proc  batch_key, trigger, events (packed; one batch per frame)
ACK            finisher → origin     ok tokens, failed [token, reason] pairs
=============  ====================  ====================================================

An *event* is a message in transit (:mod:`.events`): its envelope (origin producer and
in-flight token, :mod:`.envelope`), its id, and its data and metadata as the bytes they
were encoded to once, at the producer.  What a frame's events share is said once, in the
frame: the ``status`` (None, or why they are already failed: a producer sends failed
events in frames of their own) and the ``batch_key`` (a processor sends one frame per
key; the batcher is the one the frame goes to); inside the events, their data's codec, and
an origin, a run of tokens or a metadata that all share.  The events travel *packed* as
columns (one ``bin`` field, so that the frame header is validated once by
:func:`.frames.decode` and the events when they are opened, by :func:`open_events`, in one
C call and a few C-speed checks).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from offbroadway import Message

from . import events as ev
from .envelope import DEFAULT
from .frames import ACK, BATCH, EVENTS, RETURN, ProtocolError, frame
from .values import _pack, _unpack

#: field positions in a decoded frame
EVENTS_STATUS, EVENTS_BATCH_KEY, EVENTS_PACKED = 1, 2, 3
BATCH_KEY, BATCH_TRIGGER, BATCH_PACKED = 1, 2, 3
RETURN_PACKED = 1
ACK_OK, ACK_FAILED = 1, 2
#: positions in one of an ACK's failed ``[token, reason]`` pairs
FAILED_TOKEN, FAILED_REASON = 0, 1

#: the longest token range an ACK may name (a range is one frame's messages; this bounds
#: what a hostile one can cost)
MAX_ACK_RANGE = 1 << 20


def give_back(rows: Sequence[Sequence[Any]], codec: int = ev.MSGPACK) -> bytes:
    """RETURN: events received and not started, for their producer to dispatch again."""
    return frame(RETURN, _pack(ev.row_columns(rows, codec)))


def events(rows: Sequence[Sequence[Any]], status: str | None = None,
           batch_key: Any = DEFAULT, codec: int = ev.MSGPACK) -> bytes:
    """EVENTS: event rows that share ``status``, ``batch_key`` and their data's ``codec``."""
    return frame(EVENTS, status, batch_key, _pack(ev.row_columns(rows, codec)))


def message_events(messages: Sequence[Message], batch_key: Any = DEFAULT) -> bytes:
    """EVENTS of healthy messages going on to the next stage (a processor's output): the
    data nobody read goes on as the bytes it came with (:func:`.events.message_columns`)."""
    return frame(EVENTS, None, batch_key, _pack(ev.message_columns(messages)))


def batch(batch_key: Any, trigger: str, rows: ev.Block | Sequence[Sequence[Any]]) -> bytes:
    """BATCH of events, a block or rows (their data in the values codec: the batcher keeps
    one)."""
    cols = rows.columns() if isinstance(rows, ev.Block) else ev.row_columns(rows, ev.MSGPACK)
    return frame(BATCH, batch_key, trigger, _pack(cols))


def ack(ok: Sequence[int], failed: Sequence[Sequence[Any]] = ()) -> bytes:
    """ACK: ``ok`` tokens (sent as one ``[first, count]`` range when they are consecutive,
    the usual case: a batch's messages were emitted together) and failed ``[token,
    reason]`` pairs; the receiver reads ``ok`` with :func:`acked_tokens`."""
    n = len(ok)
    if n > 2:
        first = ok[0]
        if type(first) is int and ok[-1] == first + n - 1 and ok == list(range(first,
                                                                              first + n)):
            return frame(ACK, [[first, n]], failed)
    return frame(ACK, ok, failed)


def acked_tokens(ok: list) -> list:
    """The tokens of an ACK's ``ok`` field: plain tokens, and ``[first, count]`` ranges
    expanded (a range that is not two ints, or longer than :data:`MAX_ACK_RANGE`, is
    passed on as it is: the in-flight table counts it unknown)."""
    if not ok or type(ok[0]) is not list:
        if not any(type(t) is list for t in ok):
            return ok
    out: list = []
    for t in ok:
        if (type(t) is list and len(t) == 2 and type(t[0]) is int and type(t[1]) is int
                and 0 <= t[1] <= MAX_ACK_RANGE):
            out.extend(range(t[0], t[0] + t[1]))
        else:
            out.append(t)
    return out


def open_events(packed: bytes) -> ev.Block:
    """The events of an EVENTS, RETURN or BATCH frame (its packed columns), checked in one
    pass (:func:`.events.open_block`), else :class:`~.frames.ProtocolError`."""
    try:
        return ev.open_block(_unpack(packed))
    except ev.EventsError as exc:
        raise ProtocolError(f"malformed events: {exc}") from None
    except Exception as exc:  # msgspec raises several types for bad input
        raise ProtocolError(f"undecodable events: {type(exc).__name__}: {exc}") from None
