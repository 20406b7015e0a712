"""A JetStream message as the producer's item, and the copy a dead letter stores.

Message id: the publisher's ``Nats-Msg-Id`` header when there is one (so duplicates can be
recognised downstream), else ``<stream>:<stream sequence>``, stable across redeliveries.
A body over ``max_message_bytes`` is not handed out: the item is a failed one
(``FailedItem``, the reason beside it) with no body, and the failure policy settles it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..base import FailedItem, Item, oversized
from .settings import NatsSettings

DEAD_LETTER_HEADER = "Offbroadway-Dead-Letter"


class NatsHandle(NamedTuple):
    """What the producer keeps per message: the reply subject settles it; the rest is for
    a dead letter (the original subject, body and headers)."""

    reply: str
    delivered: int
    stream_seq: int
    subject: str
    data: bytes
    headers: dict | None


def to_item(msg: Any, max_bytes: int) -> Item:
    md = msg.metadata
    headers = dict(msg.headers) if msg.headers else None
    meta: dict[str, Any] = {
        "subject": msg.subject, "stream": md.stream, "consumer": md.consumer,
        "stream_seq": md.sequence.stream, "consumer_seq": md.sequence.consumer,
        "delivered": md.num_delivered, "redelivered": md.num_delivered > 1,
        "pending": md.num_pending, "timestamp": md.timestamp.timestamp()}
    if headers:
        meta["headers"] = headers
    msg_id = (headers or {}).get("Nats-Msg-Id") or f"{md.stream}:{md.sequence.stream}"
    handle = NatsHandle(msg.reply, md.num_delivered, md.sequence.stream, msg.subject,
                        msg.data, headers)
    if len(msg.data) > max_bytes:
        meta["body_bytes"] = len(msg.data)
        return FailedItem(msg_id, None, meta, handle, oversized(len(msg.data), max_bytes))
    return (msg_id, msg.data, meta, handle)


def dead_letter_headers(h: NatsHandle, reason: str, s: NatsSettings) -> dict[str, str]:
    """The original's headers plus where it came from and why it failed.  The original
    ``Nats-Msg-Id`` stays: a message dead-lettered twice (at least once) is then stored
    once, within the dead-letter stream's duplicate window."""
    headers = dict(h.headers or {})
    headers.update({
        f"{DEAD_LETTER_HEADER}-Reason": _header_value(reason),
        f"{DEAD_LETTER_HEADER}-Stream": s.stream,
        f"{DEAD_LETTER_HEADER}-Consumer": s.consumer,
        f"{DEAD_LETTER_HEADER}-Subject": h.subject,
        f"{DEAD_LETTER_HEADER}-Sequence": str(h.stream_seq),
        f"{DEAD_LETTER_HEADER}-Delivered": str(h.delivered)})
    return headers


def _header_value(text: str) -> str:
    """A NATS header value is one line of printable text."""
    return " ".join(str(text).split())[:1024]
