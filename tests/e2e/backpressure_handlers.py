"""Handlers with a batch sink that stalls on demand: the back-pressure tests, and the
daemon SIGKILL test that needs work in flight at the kill."""

from __future__ import annotations

import os
import time

from tests.brokers.handlers import JsonBody
from tests.e2e.handlers import Recorder


class GatedRecorder(Recorder):
    """:class:`tests.e2e.handlers.Recorder` whose ``handle_batch`` lets the first
    ``context["open_for"]`` messages through, then blocks while the file
    ``context["gate"]`` exists (a pull source's pipeline with a sink that stalls).

    The stall starts at a point the pipeline fixes, not when a test reacts to a status
    report: reports come once a second, and a quiet machine moves a whole 30k-line spool
    in less than that, so a gate closed by the test came too late (the daemon of
    ``--until-idle`` had exited before any report showed an ack)."""

    handled = 0

    def handle_batch(self, batcher, messages, batch_info, context):
        if self.handled >= context.get("open_for", 0):
            while os.path.exists(context["gate"]):
                time.sleep(0.01)
        self.handled += len(messages)
        return super().handle_batch(batcher, messages, batch_info, context)


class GatedBatches(JsonBody, GatedRecorder):
    """RabbitMQ bodies decoded, then :class:`GatedRecorder` (with no ``open_for``: it
    blocks from the first batch whenever the gate exists), as a batch processor blocked
    on a stalled Spark write does (and without a heartbeat timeout on batch processors,
    nothing kills it for that)."""
