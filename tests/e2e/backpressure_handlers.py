"""Handler for the back-pressure test: a batch sink that stops answering on demand."""

from __future__ import annotations

import os
import time

from tests.brokers.handlers import JsonBody
from tests.e2e.handlers import Recorder


class GatedBatches(JsonBody):
    """``handle_batch`` blocks while the file ``context["gate"]`` exists, as a batch
    processor blocked on a stalled Spark write does (and without a heartbeat timeout on
    batch processors, nothing kills it for that)."""

    def handle_batch(self, batcher, messages, batch_info, context):
        while os.path.exists(context["gate"]):
            time.sleep(0.01)
        return super().handle_batch(batcher, messages, batch_info, context)


class GatedRecorder(Recorder):
    """:class:`tests.e2e.handlers.Recorder` whose ``handle_batch`` blocks while the file
    ``context["gate"]`` exists (a pull source's pipeline with a stalled sink)."""

    def handle_batch(self, batcher, messages, batch_info, context):
        while os.path.exists(context["gate"]):
            time.sleep(0.01)
        return super().handle_batch(batcher, messages, batch_info, context)
