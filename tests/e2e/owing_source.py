"""A source whose broker loses some acks (a channel that closed before they were sent):
after the pipeline has handled and acked everything, it still owes those messages and says
so in its ``unacked`` figure, as a broker source does when its acks did not get through.
``--until-idle`` must not call such a run a success."""

from __future__ import annotations

from typing import Any

from offbroadway.stages.sources.base import Failure, Item, Source


class OwingSource(Source):
    """``count`` messages ``{"seq": n}``; the acks of every ``lose_every``-th are lost."""

    name = "owing"
    known_options = frozenset({"count", "lose_every"})

    def open(self) -> None:
        self.count = int(self.options.get("count", 100))
        self.lose_every = int(self.options.get("lose_every", 10))
        self.next = 0
        self.back: list[int] = []
        self.fetched = self.acked = self.failed = self.requeued = 0
        self.owed: set[int] = set()

    def fetch(self, n: int) -> list[Item]:
        seqs = self.back[:n]
        del self.back[:len(seqs)]
        while len(seqs) < n and self.next < self.count:
            seqs.append(self.next)
            self.next += 1
        self.fetched += len(seqs)
        self.owed.update(seqs)
        return [(f"m{s}", {"seq": s}, {}, s) for s in seqs]

    def ack(self, handles: list[Any]) -> None:
        for s in handles:
            if s % self.lose_every:      # the others' acks never reach the broker
                self.owed.discard(s)
                self.acked += 1

    def fail(self, failures: list[Failure]) -> None:
        for s, _reason in failures:
            self.owed.discard(s)
            self.failed += 1

    def requeue(self, handles: list[Any]) -> None:
        self.back.extend(handles)
        self.requeued += len(handles)

    def exhausted(self) -> bool:
        return self.next >= self.count and not self.back

    def stats(self) -> dict[str, Any]:
        return {"source": self.name, "fetched": self.fetched, "acked": self.acked,
                "failed": self.failed, "requeued": self.requeued, "unacked": len(self.owed)}
