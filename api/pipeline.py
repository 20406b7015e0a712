"""The handler base class: Broadway's callbacks, in Python.

A subclass is instantiated once in every stage process that runs user code, so
``__init__`` may open per-process resources.  Only ``handle_message`` is required.
"""

from __future__ import annotations

from typing import Any

from .message import BatchInfo, Message

__all__ = ["Pipeline"]


class Pipeline:
    def prepare_messages(self, messages: list[Message], context: Any) -> list[Message]:
        """Called by a processor with every message of one received frame, before
        ``handle_message``; must return the same messages (in any order)."""
        return messages

    def handle_message(self, processor: str, message: Message, context: Any) -> Message:
        raise NotImplementedError("a Pipeline must define handle_message")

    def handle_batch(self, batcher: str, messages: list[Message], batch_info: BatchInfo,
                     context: Any) -> list[Message]:
        """The sink when there is no ``[spark]`` section; with Spark, the rows to write."""
        return messages

    def handle_failed(self, messages: list[Message], context: Any) -> list[Message]:
        """Told about messages that failed, before the source's failure policy applies."""
        return messages
