"""Handlers for the page tests."""

from __future__ import annotations

import time

from offbroadway import Message, Pipeline


class Parity(Pipeline):
    """Even ``seq`` to batcher ``even``, odd to ``odd``; ``context["sleep"]`` per message."""

    def handle_message(self, processor: str, message: Message, context) -> Message:
        if context.get("sleep"):
            time.sleep(context["sleep"])
        return message.put_batcher("even" if message.data["seq"] % 2 == 0 else "odd")

    def handle_batch(self, batcher: str, messages: list[Message], batch_info, context):
        return messages
