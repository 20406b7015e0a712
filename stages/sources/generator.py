"""The ``generator`` source: synthetic messages, for benchmarks and smoke tests.

It is the benchmark source, so it must never be the bottleneck: a fetch builds its whole
batch in one list comprehension around a payload string made once, and the bookkeeping is
counters, never a per-message set.  Nothing is persisted: a restarted producer starts again
at ``seq`` 0, which is what a benchmark wants.

Options: ``count`` (messages per producer; absent means endless) and ``payload_bytes``
(length of ``data["payload"]``, default 100).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from .base import Failure, Item, Source, option_int

log = logging.getLogger("offbroadway.sources.generator")

DEFAULT_PAYLOAD_BYTES = 100


class GeneratorSource(Source):
    """Emits ``{"seq": n, "payload": str}`` with ``seq`` 0, 1, 2 … in order, on demand.

    ``metadata["producer"]`` is the producer index and the message id is
    ``"<producer>-<seq>"``, so ids are unique across producers and a duplicate downstream
    is easy to spot.  Requeued messages are re-emitted, in ``seq`` order, before new ones.
    """

    name = "generator"
    known_options = frozenset({"count", "payload_bytes"})

    def __init__(self, options: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(options, **kwargs)
        self.count: int | None = option_int(self.name, self.options, "count", None, minimum=0)
        payload_bytes = option_int(self.name, self.options, "payload_bytes",
                                   DEFAULT_PAYLOAD_BYTES, minimum=0)
        self.payload_bytes: int = DEFAULT_PAYLOAD_BYTES if payload_bytes is None else payload_bytes
        # printable and not all one byte, so compression in a sink does not flatter it
        alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
        self._payload = (alphabet * (self.payload_bytes // len(alphabet) + 1))[:self.payload_bytes]
        self._prefix = f"{self.producer_index}-"
        self._next = 0                      # next new seq
        self._requeued: list[int] = []      # seqs to re-emit, sorted
        self.fetched = self.acked = self.failed = self.requeued = 0
        self._last_failure = ""

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        super().validate_options(options)
        option_int(cls.name, options, "count", None, minimum=0)
        option_int(cls.name, options, "payload_bytes", DEFAULT_PAYLOAD_BYTES, minimum=0)

    def fetch(self, n: int) -> list[Item]:
        if n <= 0:
            return []
        out: list[Item] = []
        if self._requeued:
            seqs, self._requeued = self._requeued[:n], self._requeued[n:]
            out = self._build(seqs)
            n -= len(out)
        if n > 0:
            start = self._next
            stop = start + n if self.count is None else min(start + n, self.count)
            if stop > start:
                self._next = stop
                new = self._build(range(start, stop))
                out = new if not out else out + new
        self.fetched += len(out)
        return out

    def _build(self, seqs: Any) -> list[Item]:
        prefix, payload = self._prefix, self._payload
        # one metadata dict for all: the producer encodes it once for the frame, and every
        # message downstream decodes a fresh one of its own
        metadata = {"producer": self.producer_index}
        return [(prefix + str(s), {"seq": s, "payload": payload}, metadata, s)
                for s in seqs]

    def ack(self, handles: list[Any]) -> None:
        self.acked += len(handles)

    def fail(self, failures: list[Failure]) -> None:
        """Failure policy: reject (count and forget); there is nowhere to send them back."""
        self.failed += len(failures)
        if failures:
            self._last_failure = str(failures[-1][1])[:200]
            log.debug("generator: %d messages failed, e.g. %s", len(failures),
                      self._last_failure)

    def requeue(self, handles: list[Any]) -> None:
        if handles:
            self.requeued += len(handles)
            self._requeued = sorted(self._requeued + [int(h) for h in handles])

    def exhausted(self) -> bool:
        return not self._requeued and self.count is not None and self._next >= self.count

    def retry_after(self) -> float:
        # a short fetch means count was reached: only a requeue (which pumps) brings more
        return 1.0

    def stats(self) -> dict[str, Any]:
        in_flight = self.fetched - self.acked - self.failed - self.requeued
        return {"source": self.name, "fetched": self.fetched, "acked": self.acked,
                "failed": self.failed, "requeued": self.requeued,
                "failed_to": "dropped (the generator keeps no dead letters)",
                "unacked": in_flight + len(self._requeued), "next_seq": self._next,
                "count": self.count, "exhausted": self.exhausted(),
                "last_failure": self._last_failure}
