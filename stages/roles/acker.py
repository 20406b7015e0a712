"""Acknowledging finished messages to the producers that emitted them.

Whichever stage finishes a message (a processor when there are no batchers, else a batch
processor) acks it straight to its origin producer: one ACK frame per producer per call,
carrying the ok tokens and the failed ``[token, reason]`` pairs.  The address is the
message's delivery envelope, the runtime's: read by the codec
(:func:`~..wire.protocol.ack_groups`), never a public attribute of the message.  Failed
messages are shown to the handler's ``handle_failed`` first, as Broadway does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import zmq
from offbroadway import Message, Pipeline

from ..runtime import callbacks
from ..runtime.failures import FailureTally
from ..wire import protocol

log = logging.getLogger("offbroadway.acker")


class Acker:
    def __init__(self, producer_socks: Sequence[zmq.Socket], handler: Pipeline, context: Any,
                 counters: dict[str, int], failures: FailureTally | None = None) -> None:
        self.socks = list(producer_socks)
        #: the stage's tally of failure reasons, logged once per interval by its tick
        self.failures = failures
        self.handler = handler
        self.context = context
        self.counters = counters
        counters.setdefault("frames", 0)

    def finish(self, ok: Sequence[Message], failed: Sequence[Message]) -> None:
        if failed:
            failed = self._handle_failed(failed)
            if self.failures is not None:
                self.failures.add([m.status for m in failed], [m.id for m in failed])
        for origin, (tokens, fails) in protocol.ack_groups(ok, failed).items():
            if type(origin) is int and 0 <= origin < len(self.socks):
                self.socks[origin].send(protocol.ack(tokens, fails), zmq.NOBLOCK)
                self.counters["frames"] += 1
            else:
                log.error("ack for unknown producer %r dropped (%d messages)", origin,
                          len(tokens) + len(fails))
        self.counters["acked"] += len(ok)
        self.counters["failed"] += len(failed)

    def _handle_failed(self, failed: Sequence[Message]) -> list[Message]:
        return callbacks.handle_failed(self.handler, failed, self.context)
