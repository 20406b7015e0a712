"""Handlers for the role unit tests (tests/stages/test_roles.py)."""

from __future__ import annotations

from typing import Any

from offbroadway import BatchInfo, Message, Pipeline


class Upper(Pipeline):
    """Upper-cases each message's data; fails the ones whose data is ``"bad"``."""

    def handle_message(self, processor: str, message: Message, context: Any) -> Message:
        if message.data == "bad":
            message.failed("bad data")
        else:
            message.data = message.data.upper()
        return message


class Sizes(Pipeline):
    """Records each batch it is given (by trigger and size); fails messages marked bad."""

    seen: list[tuple[str, str, int]] = []

    def handle_message(self, processor: str, message: Message, context: Any) -> Message:
        return message

    def handle_batch(self, batcher: str, messages: list[Message], batch_info: BatchInfo,
                     context: Any) -> list[Message]:
        Sizes.seen.append((batcher, batch_info.trigger, len(messages)))
        for m in messages:
            if m.data == "bad":
                m.failed("bad row")
        return messages
