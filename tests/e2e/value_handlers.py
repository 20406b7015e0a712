"""A handler for tests/e2e/test_values.py: ``handle_message`` puts the values a handler
commonly returns into each message's data; ``handle_batch`` records, for every value it
receives, its type and its repr (so the test sees what crossed the stages)."""

from __future__ import annotations

import datetime as dt
import os
import uuid
from decimal import Decimal

from offbroadway import Message

from tests.e2e.handlers import Recorder, _append

ZONE = dt.timezone(dt.timedelta(hours=5, minutes=30))


def values(seq: int) -> dict:
    """What message ``seq`` carries on from its processor (the test builds it too)."""
    return {
        "seq": seq,
        "naive": dt.datetime(2024, 2, 29, 23, 59, 58, 123456),
        "zoned": dt.datetime(2024, 2, 29, 23, 59, 58, tzinfo=ZONE),
        "day": dt.date(2024, 2, 29),
        "price": Decimal("12.3400"),
        "ref": uuid.UUID(int=seq + 1),
        "raw": bytes([0, 255, seq % 256]),
        "nested": {"when": [dt.date(2000, 1, 1), {"at": dt.time(12, 30, tzinfo=ZONE)}],
                   "pair": (1, "two")},
    }


class Values(Recorder):
    """Message ``data["bad"]`` gets a set (which the wire cannot carry); the others the
    values above."""

    def handle_message(self, processor: str, message: Message, context) -> Message:
        seq = message.data["seq"]
        out = values(seq)
        if message.data.get("bad"):
            out["nested"]["tags"] = {"a", "b"}
        return message.put_data(out).put_batcher("default")

    def handle_batch(self, batcher: str, messages: list[Message], batch_info, context):
        _append(os.path.join(context["out"], f"batch-{os.getpid()}.jsonl"), [{
            "id": m.id, "types": _types(m.data), "repr": repr(m.data)} for m in messages])
        return messages


def _types(value: object) -> object:
    """The value with every leaf replaced by its type's name (containers kept)."""
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value).__name__
