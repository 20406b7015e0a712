"""A RabbitMQ delivery as the producer's item: message id, body, metadata and handle.

Runs once per message in the I/O thread, so it is kept lean: the AMQP properties are read
from pika's instance dict in one pass (pika sets all of them, unset ones ``None``) and only
values msgpack cannot carry as they are (pika decodes timestamps, decimals) are converted.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any, NamedTuple

from ..base import FailedItem, Item, oversized

_BASIC_PROPERTIES = ("content_type", "content_encoding", "delivery_mode", "priority",
                     "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
                     "type", "user_id", "app_id", "cluster_id")
_PROPERTY_NAMES = frozenset(_BASIC_PROPERTIES) | {"headers"}
_PLAIN = frozenset({str, bytes, bool, int, float})


class RabbitMQHandle(NamedTuple):
    """What the producer keeps per message: enough to settle it on the right channel, and
    whether it is ``doomed``: failed by the source itself for what it is (oversized, not
    decodable), so a requeue would only bring it back to fail again."""

    incarnation: int
    tag: int
    redelivered: bool
    doomed: bool = False
    #: the message's identity across its deliveries (its ``message_id``, else its body's
    #: hash): a failure requeued in this run is known again when it
    #: comes back, so it is counted once and retried with a backoff (:mod:`.settle`)
    key: Any = None


def packable(value: Any) -> Any:
    """AMQP table values as msgpack can carry them (pika decodes some to Python types)."""
    if value is None or isinstance(value, (str, bytes, bool, int, float)):
        return value
    if isinstance(value, Mapping):
        return {str(k): packable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [packable(v) for v in value]
    if isinstance(value, datetime):
        # AMQP timestamps are whole seconds since the epoch; pika gives naive UTC datetimes
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return int(value.timestamp())
    if isinstance(value, (Decimal, date)):
        return str(value)
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return str(value)


def to_item(method: Any, props: Any, body: bytes, queue: str, incarnation: int,
            session: str, max_bytes: int) -> Item:
    """The item of one delivery as pika hands it over (see :func:`item_of`)."""
    return item_of(method.delivery_tag, method.redelivered, method.exchange,
                   method.routing_key, props, body, queue, incarnation, session, max_bytes)


def item_of(tag: int, redelivered: bool, exchange: Any, routing_key: Any, props: Any,
            body: bytes, queue: str, incarnation: int, session: str,
            max_bytes: int) -> Item:
    """The item of one delivery; ``props`` is pika's ``BasicProperties``, or the dict of
    them by name :mod:`.frames` decodes, or ``None`` when the publisher set none.  Message id:
    the AMQP ``message_id`` when the publisher set one (duplicates after a redelivery can
    be recognised downstream), else ``"<delivery tag>@<session>.<incarnation>"``, unique
    per delivery.  A body over ``max_bytes`` is left with the broker: the item is a
    ``FailedItem`` with no body, and the failure policy dead-letters it whole."""
    redelivered = bool(redelivered)
    meta: dict[str, Any] = {
        "queue": queue, "routing_key": routing_key,
        "exchange": exchange, "delivery_tag": tag, "redelivered": redelivered}
    message_id = None
    if props is not None:
        wanted = _PROPERTY_NAMES
        for name, value in (props if props.__class__ is dict else vars(props)).items():
            if value is not None and name in wanted:
                meta[name] = value if value.__class__ in _PLAIN else packable(value)
        headers = meta.pop("headers", None)
        if headers:
            meta["headers"] = headers
        message_id = meta.get("message_id")
    msg_id = message_id or f"{tag}@{session}.{incarnation}"
    if len(body) > max_bytes:
        meta["body_bytes"] = len(body)
        return FailedItem(msg_id, None, meta,
                          RabbitMQHandle(incarnation, tag, redelivered, True, message_id),
                          oversized(len(body), max_bytes))
    # without message_id the body's hash stands for the message (this process's hash, 0.1 µs
    # for a small body; the books live in this process): two equal bodies are one message
    # to the failure books, which only costs them a shared backoff
    return msg_id, body, meta, RabbitMQHandle(incarnation, tag, redelivered, False,
                                              message_id or hash(body))
