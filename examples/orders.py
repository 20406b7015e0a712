"""The README's main job: orders arrive as JSON lines, are checked and priced, and land
in Spark (or, with no ``[spark]`` section, in a JSON Lines file per batch)."""

from __future__ import annotations

import json
import os

from offbroadway import Message, Pipeline


class Orders(Pipeline):
    def handle_message(self, processor: str, message: Message, context) -> Message:
        order = message.data
        if not isinstance(order, dict) or "sku" not in order or "qty" not in order:
            return message.failed("not an order: needs sku and qty")
        total = round(order["qty"] * order.get("unit_price", 0.0), 2)
        return message.update_data(lambda o: {**o, "total": total}).put_batcher(
            context.get("batcher", "spark"))

    def handle_batch(self, batcher: str, messages: list[Message], batch_info, context):
        out_dir = context.get("jsonl_output")
        if out_dir:   # the no-Spark variant: a file per batch, written before the ack
            os.makedirs(out_dir, exist_ok=True)
            path = os.path.join(out_dir, f"{batcher}-{os.getpid()}.jsonl")
            with open(path, "a") as f:
                for m in messages:
                    f.write(json.dumps({"message_id": m.id, **m.data}) + "\n")
                f.flush()
                os.fsync(f.fileno())
        return messages

    def handle_failed(self, messages: list[Message], context) -> list[Message]:
        for m in messages:
            print(f"order {m.id} failed: {m.status}", flush=True)
        return messages
