"""What the daemon knows of its stages, in one place: their last reports, the totals, the
tree as ``status`` shows it, and each child's memory and CPU (/proc).

The stages report their counters to the hub (:class:`~offbroadway.stages.wire.commands.Stats`,
``Done``, ``Settled``); :class:`Board` keeps the last report of each and the totals over
restarts (:mod:`.totals`), and reads from them what ``status``, the end-of-run lines and
the "waiting for its source" notice need.  :func:`usage` is the one walk over the
children's figures: ``status`` adds them to each node, ``/metrics`` (:mod:`..observe.metrics`)
exports them.  The tree is walked, here and wherever the answer is read, with the
supervision library's snapshot walks
(:func:`~offbroadway.supervision.tree.snapshot_nodes` and its siblings).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

from offbroadway.supervision.child import descendants, stat_fields
from offbroadway.supervision.tree import snapshot_nodes

from .topology import Topology
from .totals import StageTotals

#: the terminator's node in ``status``: it runs inside the daemon (interface contract §10)
TERMINATOR = "terminator"


#: /proc/<pid>/stat counts CPU in clock ticks and memory in pages
_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _proc_stat(pid: int) -> tuple[int, float] | None:
    """(RSS bytes, CPU seconds) from one read of ``/proc/<pid>/stat``, or None if it is
    gone.  ``status`` and every scrape ask this of each child; psutil's way (a
    ``Process`` that parses ``stat`` for its start time, then ``statm`` and ``stat``
    again) took 144 µs a child against 30 µs for this (timeit, 2,000 calls each)."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    # utime, stime: fields 14, 15 of proc(5); rss: field 24 (the list starts at field 3)
    return int(fields[21]) * _PAGE, (int(fields[11]) + int(fields[12])) / _TICK


def process_usage(pid: int, *, tree: bool = False) -> tuple[int, float] | None:
    """(RSS bytes, CPU seconds) of a child process, or None if it is gone.

    With ``tree``, its descendants are added: the Spark child is a thin wrapper whose JVM
    (the memory an operator cares about) is its child process.
    """
    own = _proc_stat(pid)
    if own is None or not tree:
        return own
    rss, cpu_s = own
    for kid in descendants(pid):
        figures = _proc_stat(kid)
        if figures is not None:
            rss, cpu_s = rss + figures[0], cpu_s + figures[1]
    return rss, cpu_s


def usage(tree: dict, spark_id: str | None) -> Iterator[tuple[dict, tuple[int, float]]]:
    """(node, (RSS bytes, CPU seconds)) for every node that is a live process; the Spark
    child's row counts its JVM too."""
    for node in snapshot_nodes(tree):
        pid = node.get("pid")
        if pid:
            figures = process_usage(pid, tree=node["id"] == spark_id)
            if figures is not None:
                yield node, figures


class Board:
    """The stages' last reports and the totals over their restarts."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        #: stage id -> its last report's counters, with ``at`` (when it came)
        self.stats: dict[str, dict] = {}
        self.totals = StageTotals()

    def record(self, stage_id: str, stats: dict) -> None:
        # a late last report of an earlier incarnation counts in the totals only
        if self.totals.report(stage_id, stats):
            self.stats[stage_id] = {**stats, "at": time.time()}

    def sum(self, stages: list[str], key: str) -> int:
        return self.totals.sum(stages, key)

    def source(self, producer: str) -> dict:
        """The source's figures as ``producer`` last reported them ({} if none)."""
        src = self.stats.get(producer, {}).get("source")
        return src if isinstance(src, dict) else {}

    def all_reported(self) -> bool:
        return all(p in self.stats for p in self.topology.producers)

    def sources_down(self) -> list[str]:
        """``producer_i: state (last error)`` for each source that is not connected."""
        out = []
        for p in self.topology.producers:
            stats = self.stats.get(p)
            if stats is None or stats.get("source_connected", 1):
                continue
            src = self.source(p)
            err = src.get("last_error")
            out.append(f"{p}: {src.get('state', 'not connected')}" + (f" ({err})" if err else ""))
        return out

    def spark_down(self) -> list[str]:
        """``committer_k: unreachable since HH:MM:SS UTC (N s): why`` for each committer
        whose Spark does not answer (its probe, while a job waits: stages/roles/committer)."""
        out = []
        for stage, stats in self.stats.items():
            since = stats.get("spark_unreachable_since")
            if not since:
                continue
            clock = time.strftime("%H:%M:%S", time.gmtime(since))
            out.append(f"{stage}: unreachable since {clock} UTC ({time.time() - since:.0f} s):"
                       f" {stats.get('spark_unreachable') or '?'}")
        return out

    def failed_to(self) -> str:
        """Where the source puts failed messages, as its producers report it."""
        places: list[str] = []
        for p in self.topology.producers:
            where = self.source(p).get("failed_to")
            if where and where not in places:
                places.append(where)
        return "; ".join(places)

    def tree(self, snapshot: dict, terminator_state: str) -> dict:
        """The supervision tree as ``status`` shows it: the terminator's node, each
        stage's last counters (``messages``) and each process's memory and CPU."""
        snapshot["children"].append({
            "id": TERMINATOR, "kind": "worker", "strategy": None, "pid": None,
            "state": terminator_state, "restarts": 0, "children": []})
        for node in snapshot_nodes(snapshot):
            stats = self.stats.get(node["id"])
            if stats is not None:
                node["messages"] = {k: v for k, v in stats.items() if k != "at"}
        for node, (rss, cpu) in usage(snapshot, self.topology.spark):
            node["rss_bytes"], node["cpu_seconds"] = rss, cpu
        return snapshot
