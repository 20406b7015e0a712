"""Message counts per stage that survive the stage's restarts.

A stage reports its counters from zero in each incarnation (they live in the process).
The daemon keeps, per stage, the last report of every earlier incarnation folded into a
base, so "rows written" at the end of a run counts what the batch processors that were
killed along the way wrote too.
"""

from __future__ import annotations

COUNTED = ("in", "out", "failed", "acked", "requeued", "batches", "already_written")
#: a producer's source's own counts, folded the same way and read as ``"source.<key>"``:
#: messages rejected (failed for good), failed deliveries, failures requeued
SOURCE_COUNTED = ("rejected", "failures", "failure_requeued")


def _source(stats: dict) -> dict:
    src = stats.get("source")
    return src if isinstance(src, dict) else {}


class StageTotals:
    def __init__(self) -> None:
        self._base: dict[str, dict[str, int]] = {}
        self._last: dict[str, dict] = {}

    def report(self, stage: str, stats: dict) -> None:
        last = self._last.get(stage)
        if last is not None and last.get("pid") != stats.get("pid"):
            base = self._base.setdefault(stage, {})
            for key in COUNTED:
                base[key] = base.get(key, 0) + int(last.get(key, 0))
            src = _source(last)
            for key in SOURCE_COUNTED:
                base["source." + key] = base.get("source." + key, 0) + int(src.get(key) or 0)
        self._last[stage] = stats

    def total(self, stage: str, key: str) -> int:
        last = self._last.get(stage, {})
        now = int(_source(last).get(key[7:]) or 0) if key.startswith("source.") \
            else int(last.get(key, 0))
        return self._base.get(stage, {}).get(key, 0) + now

    def sum(self, stages: list[str], key: str) -> int:
        return sum(self.total(s, key) for s in stages)

    def stages(self) -> list[str]:
        """Every stage that reported, including those a resize removed since."""
        return list(self._last)
