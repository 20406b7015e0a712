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
#: a report of the previous incarnation is taken as its late last one while its successor
#: has sent fewer reports than this (a report a second: the last one is milliseconds late)
LATE = 3


def _source(stats: dict) -> dict:
    src = stats.get("source")
    return src if isinstance(src, dict) else {}


class StageTotals:
    def __init__(self) -> None:
        self._base: dict[str, dict[str, int]] = {}
        self._last: dict[str, dict] = {}
        #: stage -> (pid, last report) of the incarnation before the current one (folded
        #: in the base), and how many reports its successor has sent since
        self._retired: dict[str, tuple[object, dict]] = {}
        self._since: dict[str, int] = {}

    def report(self, stage: str, stats: dict) -> bool:
        """Take a report; False if it came from the previous incarnation (a stage's last
        report, sent as it exits, can arrive just after its successor's first): its
        figures past those already folded are added to the base, and it is not the
        stage's current report.  Only within the successor's first few reports: a pid
        can come back for another process later."""
        pid = stats.get("pid")
        retired = self._retired.get(stage)
        if retired is not None and retired[0] == pid and self._since.get(stage, 0) < LATE:
            self._fold(stage, stats, since=retired[1])
            self._retired[stage] = (pid, stats)
            return False
        last = self._last.get(stage)
        if last is not None and last.get("pid") != pid:
            self._fold(stage, last)
            self._retired[stage] = (last.get("pid"), last)
            self._since[stage] = 0
        self._since[stage] = self._since.get(stage, 0) + 1
        self._last[stage] = stats
        return True

    def _fold(self, stage: str, stats: dict, since: dict | None = None) -> None:
        """Add ``stats`` (less ``since``, the same incarnation's figures folded before)
        to the stage's base."""
        base = self._base.setdefault(stage, {})
        before = since or {}
        for key in COUNTED:
            base[key] = base.get(key, 0) + int(stats.get(key, 0)) - int(before.get(key, 0))
        src, src_before = _source(stats), _source(before)
        for key in SOURCE_COUNTED:
            base["source." + key] = (base.get("source." + key, 0) + int(src.get(key) or 0)
                                     - int(src_before.get(key) or 0))

    def credit(self, stage: str, key: str, n: int) -> None:
        """Counts the stage made that none of its reports carried (acks a killed
        producer's last frame settled, known at the run's end)."""
        base = self._base.setdefault(stage, {})
        base[key] = base.get(key, 0) + n

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
