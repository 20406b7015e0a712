"""Acknowledging finished messages to the producers that emitted them.

Whichever stage finishes a message (a processor when there are no batchers, else a batch
processor) acks it straight to its origin producer: one ACK frame per producer per call,
carrying the ok tokens and the failed ``[token, reason]`` pairs.  Failed messages are shown
to the handler's ``handle_failed`` first, as Broadway does.
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
                self.failures.add(m.status for m in failed)
        per_origin: dict[int, tuple[list, list]] = {}
        if ok:
            first = ok[0].origin
            origins = [m.origin for m in ok]
            if origins.count(first) == len(origins):    # one producer: the usual case
                per_origin[first] = ([m.token for m in ok], [])
            else:
                for m in ok:
                    per_origin.setdefault(m.origin, ([], []))[0].append(m.token)
        for m in failed:
            per_origin.setdefault(m.origin, ([], []))[1].append([m.token, m.status or "failed"])
        for origin, (tokens, fails) in per_origin.items():
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
