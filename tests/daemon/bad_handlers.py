"""Handlers for the bad-input tests: each is wrong in one way a user could write."""

from __future__ import annotations

from offbroadway import Message, Pipeline


class RaisingInit(Pipeline):
    """Its constructor fails: every stage would crash making one."""

    def __init__(self) -> None:
        raise RuntimeError("cannot reach the pricing table")

    def handle_message(self, processor: str, message: Message, context: object) -> Message:
        return message


class NoHandleMessage:
    """Not a pipeline at all."""


class UnknownBatcher(Pipeline):
    """Routes every message to a batcher the config does not have."""

    def handle_message(self, processor: str, message: Message, context: object) -> Message:
        return message.put_batcher("nosuch")

    def handle_batch(self, batcher, messages, info, context):
        return messages


class ExitsInInit(Pipeline):
    """``sys.exit`` in the constructor: not an Exception, still a broken handler."""

    def __init__(self) -> None:
        raise SystemExit(4)

    def handle_message(self, processor: str, message: Message, context: object) -> Message:
        return message
