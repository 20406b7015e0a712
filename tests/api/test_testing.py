"""The in-process test helpers users unit-test their pipelines with (Broadway's
``test_message`` / ``test_batch``): the same callback semantics as the stages."""

from __future__ import annotations

from offbroadway import Message, Pipeline
from offbroadway.testing import test_batch, test_message, test_messages

from examples.orders import Orders


class Doubler(Pipeline):
    def handle_message(self, processor, message, context):
        if message.data == "raise":
            raise ValueError("no strings attached")
        if message.data < 0:
            return message.failed("negative")
        return message.update_data(lambda d: d * 2).put_batcher("even" if message.data % 4 == 0
                                                                 else "odd")

    def handle_batch(self, batcher, messages, batch_info, context):
        context.setdefault("batches", []).append((batcher, batch_info.size))
        return [m for m in messages if m.data != 6]   # leaves one out: it must fail

    def handle_failed(self, messages, context):
        context.setdefault("failed_seen", []).extend(m.data for m in messages)
        return messages


def test_test_message_runs_handle_message_only() -> None:
    result = test_message(Doubler(), 3)
    assert [m.data for m in result.successful] == [6]
    assert result.failed == [] and result.batches == []


def test_failures_and_exceptions_reach_handle_failed() -> None:
    context: dict = {}
    result = test_messages(Doubler(), [1, -1, "raise"], context=context)
    assert [m.data for m in result.successful] == [2]
    reasons = sorted(m.status for m in result.failed)
    assert reasons[0] == "handle_message raised ValueError: no strings attached"
    assert reasons[1] == "negative"
    assert sorted(map(str, context["failed_seen"])) == ["-1", "raise"]


def test_batches_group_by_batcher_and_size_and_missing_messages_fail() -> None:
    context: dict = {}
    result = test_messages(Doubler(), [1, 2, 3, 4, 5], context=context,
                           batchers={"even": 2, "odd": 2})
    # data doubled: 2, 4, 6, 8, 10 → even batcher gets 4 and 8, odd gets 2, 6, 10
    assert sorted(context["batches"]) == [("even", 2), ("odd", 1), ("odd", 2)]
    assert sorted(m.data for m in result.successful) == [2, 4, 8, 10]
    assert [(m.data, m.status) for m in result.failed] == [(6, "not returned by handle_batch")]


def test_test_batch_with_the_example_pipeline() -> None:
    result = test_batch(Orders(), [{"sku": "fig", "qty": 2, "unit_price": 1.5}, {"qty": 1}],
                        batcher="spark", context={"batcher": "spark"})
    assert [m.data["total"] for m in result.successful] == [3.0]
    assert [m.status for m in result.failed] == ["not an order: needs sku and qty"]
    assert isinstance(result.successful[0], Message)


class Filter(Pipeline):
    """Discards odd numbers (acked, written nowhere), routes the rest to ``spark``."""

    def handle_message(self, processor, message, context):
        if message.data % 2:
            return message.discard()
        return message.put_batcher("spark")


def test_discarded_messages_are_acked_and_reach_no_batch() -> None:
    result = test_messages(Filter(), [1, 2, 3, 4], batchers={"spark": 10})
    assert [m.data for m in result.discarded] == [1, 3]
    assert all(m.is_discarded for m in result.discarded)
    assert [m.data for _, batch in result.batches for m in batch] == [2, 4]
    assert [m.data for m in result.successful] == [2, 4] and result.failed == []
