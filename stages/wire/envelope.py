"""A message's delivery envelope, and messages made from events and back.

A message's delivery envelope (its origin producer and in-flight token) is the runtime's:
:class:`~offbroadway.Message` keeps it in two private slots that only the codec sets
(:func:`.events.to_messages`, :func:`address`) and reads (:func:`.events.message_columns`,
:func:`ack_groups`, :data:`envelope_of`).  Slots, not a proxy object beside each message:
a message is built once per message in every stage that runs user code, and a slot read is
the cheapest read.  Messages are built only where user code runs (:func:`to_messages`), and
decode a value only when user code reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any

from offbroadway import Message

from . import events as ev

#: the batcher and batch key of a message nobody routed
DEFAULT = "default"

#: a message's envelope as ``(origin, token)`` (for tests and handlers of the tests)
envelope_of = attrgetter("_origin", "_token")

#: a row's fields, by name (:mod:`.events`)
ORIGIN, TOKEN, ID, DATA, METADATA = ev.ORIGIN, ev.TOKEN, ev.ID, ev.DATA, ev.METADATA


def address(message: Message, origin: int, token: int) -> Message:
    """Give ``message`` a delivery envelope (the acks of ``message`` go to producer
    ``origin`` as ``token``) and return it: for tests and benches that build messages
    by hand; the stages get theirs off the wire (:func:`to_messages`)."""
    message._origin = origin
    message._token = token
    return message


def ack_groups(ok: Sequence[Message], failed: Sequence[Message]
               ) -> dict[int, tuple[list, list]]:
    """Finished messages by their origin producer: origin -> (the ok tokens, the failed
    ``[token, reason]`` pairs), one :func:`.delivery.ack` frame each.  The envelope is read
    here, in the codec, with plain slot reads (faster than a getter call per message)."""
    groups: dict[int, tuple[list, list]] = {}
    if ok:
        first = ok[0]._origin
        origins = [m._origin for m in ok]
        if origins.count(first) == len(origins):    # one producer: the usual case
            groups[first] = ([m._token for m in ok], [])
        else:
            for m in ok:
                groups.setdefault(m._origin, ([], []))[0].append(m._token)
    for m in failed:
        groups.setdefault(m._origin, ([], []))[1].append([m._token, m.status or "failed"])
    return groups


def to_messages(block: ev.Block, status: str | None = None, batcher: str = DEFAULT,
                batch_key: Any = DEFAULT) -> list[Message]:
    """Messages for user code, from a frame's events that share ``status``, ``batcher`` and
    ``batch_key`` (as :func:`.delivery.open_events` returned them)."""
    return ev.to_messages(block, status, batcher, batch_key)


def event_to_message(row: Sequence[Any], status: str | None = None,
                     codec: int = ev.MSGPACK) -> Message:
    """One event row as a message (routing functions that need one; not the hot path)."""
    return ev.row_message(row, codec, status)


def new_events(origin: int, first_token: int, items: Sequence[Sequence[Any]]) -> list[tuple]:
    """Rows for a source's ``(id, data, metadata, handle)`` items, with tokens from
    ``first_token`` on, their values encoded (the producer does this in two steps, to
    know the codec and the items the codec refused)."""
    _, ids, datas, metas, _ = ev.encode_items(items)
    return ev.new_rows(origin, first_token, ids, datas, metas)


def event_id(e: Sequence[Any]) -> Any:
    return e[ID]


def event_token(e: Sequence[Any]) -> Any:
    return e[TOKEN]


def event_origin(e: Sequence[Any]) -> Any:
    return e[ORIGIN]
