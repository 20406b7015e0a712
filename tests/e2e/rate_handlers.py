"""A handler for the rate-limit tests: records when each message was handled, so the rate
is measured from what the processors did, not from the limiter's own counters."""

from __future__ import annotations

import json
import os
import time

from offbroadway import Message, Pipeline


class Stamped(Pipeline):
    """Appends ``{"t": wall clock}`` per message to ``<out>/stamps-<pid>.jsonl``."""

    _file = None

    def handle_message(self, processor: str, message: Message, context) -> Message:
        if Stamped._file is None:
            Stamped._file = open(os.path.join(context["out"], f"stamps-{os.getpid()}.jsonl"),
                                 "a", buffering=1)     # line-buffered: readable at once
        Stamped._file.write(json.dumps({"t": time.time()}) + "\n")
        return message


def stamps(out_dir: str) -> list[float]:
    times = []
    for name in os.listdir(out_dir):
        if name.startswith("stamps-"):
            with open(os.path.join(out_dir, name)) as f:
                times.extend(json.loads(line)["t"] for line in f if line.endswith("\n"))
    return times
