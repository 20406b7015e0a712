"""Handlers whose poison messages kill the processor itself, for tests/e2e/test_poison.py.

A message with ``data["poison"]`` (or, from RabbitMQ, a body containing ``"poison"``)
records its delivery (fsync'd, so the record exists before the process dies) and then ends
its process the way ``data["poison"]`` names: ``exit`` (``os._exit(3)``), ``segv`` (reads
address 0), ``memory`` (allocates until the supervisor's ``memory_limit`` kills it).
Everything else is recorded as handled, as :class:`tests.e2e.handlers.NoBatch` does.
"""

from __future__ import annotations

import ctypes
import json
import os
import time

from offbroadway import Message

from tests.e2e.handlers import NoBatch, Recorder, _append

#: the memory poison stops allocating here: a missing memory_limit must not take the machine
MEMORY_CAP = 1 << 30


def _poison_kind(message: Message) -> str | None:
    data = message.data
    if isinstance(data, dict):
        return data.get("poison")
    if isinstance(data, (bytes, bytearray)) and b"poison" in data:
        return json.loads(data).get("poison")
    return None


def die(kind: str) -> None:
    if kind == "exit":
        os._exit(3)
    if kind == "segv":
        ctypes.string_at(0)
    if kind == "memory":
        hog = []
        while sum(map(len, hog)) < MEMORY_CAP:
            hog.append(b"\x01" * (16 << 20))   # written, so resident
            time.sleep(0.05)
        while True:                            # wait for the kill
            time.sleep(1)
    raise AssertionError(f"unknown poison {kind!r}")


def _deliveries(context) -> str:
    return os.path.join(context["out"], "poison-deliveries.jsonl")


class Poisoned(NoBatch):
    """No batchers: good messages are recorded in ``handled-*.jsonl``."""

    def handle_message(self, processor: str, message: Message, context) -> Message:
        kind = _poison_kind(message)
        if kind:
            _append(_deliveries(context), [{"id": message.id, "pid": os.getpid()}])
            die(kind)
        if isinstance(message.data, (bytes, bytearray)):
            _append(os.path.join(context["out"], f"handled-{os.getpid()}.jsonl"),
                    [{"id": message.id}])
            return message
        return super().handle_message(processor, message, context)


class PoisonedBatched(Recorder):
    """With batchers: good messages are recorded in ``batch-*.jsonl`` by handle_batch."""

    def handle_message(self, processor: str, message: Message, context) -> Message:
        kind = _poison_kind(message)
        if kind:
            _append(_deliveries(context), [{"id": message.id, "pid": os.getpid()}])
            die(kind)
        return super().handle_message(processor, message, context)


class PoisonedPrepare(NoBatch):
    """The poison kills the process in ``prepare_messages``, for a whole frame."""

    def prepare_messages(self, messages: list[Message], context) -> list[Message]:
        for m in messages:
            kind = _poison_kind(m)
            if kind:
                _append(_deliveries(context), [{"id": m.id, "pid": os.getpid(),
                                                "frame": len(messages)}])
                die(kind)
        return messages
