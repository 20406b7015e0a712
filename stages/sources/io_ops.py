"""What a producer asks its broker source's I/O thread to do: one typed record per operation.

A broker client lives in a thread of its own (pika's connection for ``rabbitmq``, an
asyncio loop for ``nats``); the producer's thread hands it work through a deque (its
deliveries come back through a :class:`~.mailbox.Mailbox`).  Each operation is a record
here, shared by the sources, and the I/O thread matches on its type: a new operation is a
new record, and a thread that does not run it says so by not matching it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Ack:
    """Settle these deliveries as done (their batch was written)."""

    handles: list[Any]


@dataclass(frozen=True, slots=True)
class Fail:
    """Settle these ``(handle, reason)`` failures by the source's failure policy."""

    failures: list[Any]


@dataclass(frozen=True, slots=True)
class Requeue:
    """Hand these deliveries back to the broker (a stage died holding them)."""

    handles: list[Any]


@dataclass(frozen=True, slots=True)
class Pause:
    """Stop taking deliveries and give back those not fetched yet (the stop's drain, or
    the operator's pause)."""


@dataclass(frozen=True, slots=True)
class Resume:
    """Take deliveries again after a :class:`Pause`."""


@dataclass(frozen=True, slots=True)
class Window:
    """A resize changed the auto prefetch window: this many deliveries unsettled at most."""

    prefetch: int


@dataclass(frozen=True, slots=True)
class Reconcile:
    """The daemon's word on messages in the source's failure books, as ``(digest, when)``
    pairs: ``settled`` were acked or rejected by a sibling producer since, ``moved`` failed
    again on one (see :mod:`.rabbitmq.settle`)."""

    settled: list[Any]
    moved: list[Any]


#: every operation an I/O thread may be handed
IoOp = Ack | Fail | Requeue | Pause | Resume | Window | Reconcile
