"""Handler for the dead-letter replay tests: an order without a ``sku`` fails ("no sku")
until the config says ``context.fixed = true``; every message ``handle_batch`` gets is
recorded (fsync'd) as written."""

from __future__ import annotations

import json
import os

from offbroadway import Message, Pipeline

from tests.e2e.handlers import _append, read_records


class Picky(Pipeline):
    def handle_message(self, processor: str, message: Message, context) -> Message:
        data = message.data
        if isinstance(data, (bytes, bytearray)):
            data = json.loads(data)          # a broker's body
        elif "seq" in data and isinstance(data["seq"], str):
            data = {**data, "seq": int(data["seq"])}     # a Redis entry's fields
        message = message.update_data(lambda _d: data)
        if "sku" not in data and not context.get("fixed"):
            return message.failed("no sku")
        return message.put_batcher("default")

    def handle_batch(self, batcher: str, messages: list[Message], batch_info, context):
        _append(os.path.join(context["out"], f"written-{os.getpid()}.jsonl"),
                [{"seq": m.data["seq"], "id": m.id} for m in messages])
        return messages


def written(out: str) -> list[int]:
    """Every seq handle_batch got, in no particular order (duplicates kept)."""
    return [r["seq"] for r in read_records(out, "written-")]
