"""Unit-testing a pipeline's callbacks in-process, as Broadway's ``test_message`` /
``test_batch``: no processes, no sockets, the same callback semantics as the stages
(they call the same functions in :mod:`offbroadway.stages.runtime.callbacks`).

    from offbroadway.testing import test_messages

    result = test_messages(Orders(), [{"sku": "fig", "qty": 2}], batchers={"spark": 100})
    assert [m.data["total"] for m in result.successful] == [...]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from .message import BatchInfo, Message
from .pipeline import Pipeline

__all__ = ["Result", "test_batch", "test_message", "test_messages"]


@dataclass
class Result:
    """What the source would be told: acked and failed messages, plus the batches made.

    ``discarded`` are acked too, without reaching a batcher (:meth:`Message.discard`, with
    batchers); without batchers a discarded message is simply in ``successful``."""

    successful: list[Message] = field(default_factory=list)
    failed: list[Message] = field(default_factory=list)
    discarded: list[Message] = field(default_factory=list)
    batches: list[tuple[BatchInfo, list[Message]]] = field(default_factory=list)


def _messages(data: Iterable[Any], metadata: dict | None) -> list[Message]:
    return [Message(f"test-{i}", d, dict(metadata or {})) for i, d in enumerate(data)]


def test_messages(pipeline: Pipeline, data: Iterable[Any], *, context: Any = None,
                  metadata: dict | None = None, batchers: dict[str, int] | None = None
                  ) -> Result:
    """Run messages through ``handle_message`` and, if ``batchers`` (key → batch_size) are
    given, through ``handle_batch`` in batches of that size per batcher and batch key,
    as the drain would flush them.  Failed messages go through ``handle_failed``."""
    from offbroadway.stages.runtime import callbacks

    context = {} if context is None else context
    done, failed, discarded = callbacks.process(pipeline, _messages(data, metadata), context,
                                                set(batchers or ()))
    result = Result(discarded=discarded)
    if not batchers:
        result.successful = done
    else:
        groups: dict[tuple[str, Any], list[Message]] = {}
        for m in done:
            groups.setdefault((m.batcher, m.batch_key), []).append(m)
        for (batcher, key), msgs in groups.items():
            size = batchers[batcher]
            for start in range(0, len(msgs), size):
                chunk = msgs[start:start + size]
                info = BatchInfo(batcher, key, len(chunk),
                                 "size" if len(chunk) == size else "flush")
                rows = callbacks.handle_batch(pipeline, batcher, chunk, info, context)
                result.batches.append((info, chunk))
                result.successful.extend(rows)
                failed.extend(m for m in chunk if m.status is not None)
    if failed:
        result.failed = callbacks.handle_failed(pipeline, failed, context)
    return result


def test_message(pipeline: Pipeline, data: Any, **kwargs: Any) -> Result:
    return test_messages(pipeline, [data], **kwargs)


def test_batch(pipeline: Pipeline, data: Iterable[Any], *, batcher: str = "default",
               batch_size: int | None = None, **kwargs: Any) -> Result:
    """All of ``data`` through ``handle_message`` into one batcher's ``handle_batch``."""
    items = list(data)
    return test_messages(pipeline, items, batchers={batcher: batch_size or max(1, len(items))},
                         **kwargs)


# pytest would otherwise collect these helpers as tests when a user imports them.
test_messages.__test__ = False  # type: ignore[attr-defined]
test_message.__test__ = False  # type: ignore[attr-defined]
test_batch.__test__ = False  # type: ignore[attr-defined]
