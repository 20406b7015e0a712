"""Handlers for the daemon-level broker tests: bodies decoded, then the e2e Recorder."""

from __future__ import annotations

import json

from offbroadway import Message

from tests.e2e.handlers import Recorder


class JsonBody(Recorder):
    """RabbitMQ delivers bytes: decode the JSON body, then record as the e2e tests do."""

    def handle_message(self, processor: str, message: Message, context) -> Message:
        message.update_data(json.loads)
        return super().handle_message(processor, message, context)


class FieldMap(Recorder):
    """Redis entries are field maps already; "fail" is "1" or ""."""


class Filters(JsonBody):
    """Discards (acks without writing) the messages whose body has ``"drop": true``."""

    def handle_message(self, processor: str, message: Message, context) -> Message:
        message = super().handle_message(processor, message, context)
        if message.data.get("drop"):
            return message.discard()
        return message


class Flaky(JsonBody):
    """Fails the first delivery of each message whose body has ``"flaky": true`` (a
    transient error: its redelivery succeeds)."""

    def handle_message(self, processor: str, message: Message, context) -> Message:
        if not message.metadata["redelivered"] and b'"flaky": true' in message.data:
            return message.failed("a transient error, on purpose")
        return super().handle_message(processor, message, context)


class SlowBatches(JsonBody):
    """``handle_batch`` sleeps ``context["batch_slow"]`` seconds for a batch holding a
    message whose body has ``"slow": true``."""

    def handle_batch(self, batcher: str, messages: list[Message], batch_info, context):
        if any(isinstance(m.data, dict) and m.data.get("slow") for m in messages):
            import time

            time.sleep(context["batch_slow"])
        return super().handle_batch(batcher, messages, batch_info, context)
