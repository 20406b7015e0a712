"""The message that travels through a pipeline, as Broadway's ``%Broadway.Message{}``.

Users see ``id``, ``data`` and ``metadata`` and steer a message with the chainable
``put_batcher`` / ``put_batch_key`` / ``update_data`` / ``failed`` / ``discard``.
The chainable methods
mutate and return ``self``: a message belongs to exactly one stage at a time, so copying
it on every call (as Elixir must) would only cost allocations on the hot path.

The delivery envelope (where the message's acknowledgement goes: the index of the
producer that emitted it and that producer's in-flight key) is the runtime's, not the
user's, as Dramatiq keeps a broker's delivery tag on its ``MessageProxy`` rather than on
its ``Message``.  The wire codec (:mod:`offbroadway.stages.wire.events`) sets it on the
messages it builds and reads it back, in two private slots, so that carrying it costs the
hot path nothing (a proxy object per message would cost an allocation and an indirection
on every attribute).  A message a handler builds itself has the empty envelope (producer
0, token 0).  A program that moves messages itself (a test, a lean pipeline of its own
such as the yardstick in the benchmarks) may still give ``origin=`` / ``token=`` to the
constructor and read them back as ``origin`` / ``token``; those names are read-only and
the runtime never reads them.

The messages a stage builds off the wire are of a subclass,
:class:`offbroadway.stages.wire.events.WireMessage`, whose ``data`` and ``metadata`` stay
the bytes they travelled as until something reads them: a handler that routes on the id
or the batcher never pays for decoding a body, and a value nobody read goes on as it came.
To user code they are ``Message``s like any other.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["DISCARD", "BatchInfo", "Message"]

#: the batcher of a discarded message (:meth:`Message.discard`): no configured batcher can
#: be named so (the config allows letters, digits, ``_`` and ``-`` in a batcher's key)
DISCARD = "\x00discard"


class Message:
    __slots__ = ("_origin", "_token", "batch_key", "batcher", "data", "id", "metadata", "status")

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
        # the delivery envelope: the runtime's (module doc), empty until the codec sets it
        self._origin = origin
        self._token = token

    @property
    def origin(self) -> int:
        """The producer this message's acknowledgement goes to (read-only; module doc)."""
        return self._origin

    @property
    def token(self) -> int:
        """That producer's in-flight key for this message (read-only; module doc)."""
        return self._token

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

