"""The message that travels through a pipeline, as Broadway's ``%Broadway.Message{}``.

Users see ``id``, ``data`` and ``metadata`` and steer a message with the chainable
``put_batcher`` / ``put_batch_key`` / ``update_data`` / ``failed`` / ``discard``.
The chainable methods
mutate and return ``self``: a message belongs to exactly one stage at a time, so copying
it on every call (as Elixir must) would only cost allocations on the hot path.

``origin`` and ``token`` are the acknowledgement address: the index of the producer that
emitted the message and that producer's in-flight key.  They are set by the runtime and
travel with the message so the stage that finishes it can ack straight to its origin.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["DISCARD", "BatchInfo", "Message"]

#: the batcher of a discarded message (:meth:`Message.discard`): no configured batcher can
#: be named so (the config allows letters, digits, ``_`` and ``-`` in a batcher's key)
DISCARD = "\x00discard"


class Message:
    __slots__ = ("batch_key", "batcher", "data", "id", "metadata", "origin", "status", "token")

    def __init__(
        self,
        id: str,
        data: Any,
        metadata: dict | None = None,
        *,
        batcher: str = "default",
        batch_key: Any = "default",
        origin: int = 0,
        token: int = 0,
    ) -> None:
        self.id = id
        self.data = data
        self.metadata = metadata if metadata is not None else {}
        self.batcher = batcher
        self.batch_key = batch_key
        #: ``None`` while the message is healthy, else the failure reason (a string).
        self.status: str | None = None
        self.origin = origin
        self.token = token

    # -- chainable API (Broadway.Message) ------------------------------------------------
    def put_batcher(self, batcher: str) -> Message:
        self.batcher = batcher
        return self

    def put_batch_key(self, key: Any) -> Message:
        self.batch_key = key
        return self

    def put_data(self, data: Any) -> Message:
        self.data = data
        return self

    def update_data(self, fn: Callable[[Any], Any]) -> Message:
        self.data = fn(self.data)
        return self

    def failed(self, reason: Any) -> Message:
        self.status = str(reason)
        return self

    def discard(self) -> Message:
        """Acknowledge this message to its source without writing it anywhere.

        For filtering in ``handle_message`` (or ``prepare_messages``): a discarded message
        goes to no batcher and no Spark row; it is acked at once as a success, so the source
        forgets it (RabbitMQ ``basic.ack``, Redis ``XACK``, a spool line recorded as done).
        Failing it instead would send it to ``handle_failed`` and the dead letter.  This is
        what Broadway users do with ``Message.ack_immediately/1`` for messages they drop.
        A later ``put_batcher`` undoes it; in ``handle_batch`` it has no effect (return the
        message to write it, leave it out to fail it).
        """
        self.batcher = DISCARD
        return self

    @property
    def is_discarded(self) -> bool:
        return self.batcher == DISCARD

    @property
    def is_failed(self) -> bool:
        return self.status is not None

    def __repr__(self) -> str:
        state = "ok" if self.status is None else f"failed: {self.status}"
        return f"Message(id={self.id!r}, data={self.data!r}, batcher={self.batcher!r}, {state})"


class BatchInfo:
    """What ``handle_batch`` is told about its batch (Broadway's ``%BatchInfo{}``)."""

    __slots__ = ("batch_key", "batcher", "partition", "size", "trigger")

    def __init__(self, batcher: str, batch_key: Any, size: int, trigger: str,
                 partition: int | None = None) -> None:
        self.batcher = batcher
        self.batch_key = batch_key
        self.size = size
        #: why the batch was emitted: ``"size"``, ``"timeout"`` or ``"flush"`` (drain).
        self.trigger = trigger
        self.partition = partition

    def __repr__(self) -> str:
        return (f"BatchInfo(batcher={self.batcher!r}, batch_key={self.batch_key!r}, "
                f"size={self.size}, trigger={self.trigger!r})")


def _wire_message(origin: int, token: int, id: Any, data: Any, metadata: Any, batcher: str,
                  batch_key: Any, status: str | None, _new: Any = object.__new__,
                  _cls: type = Message) -> Message:
    """A message off the wire (the runtime's constructor, not the user's): slots set
    directly, positionally, which costs about half of ``Message(...)`` with its keywords;
    it is called once per message in every stage that runs user code."""
    m = _new(_cls)
    m.id = id
    m.data = data
    m.metadata = metadata
    m.batcher = batcher
    m.batch_key = batch_key
    m.status = status
    m.origin = origin
    m.token = token
    return m
