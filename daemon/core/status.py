"""What the daemon knows of its stages, in one place: their last reports, the totals and
the tree as ``status`` shows it (each child's memory and CPU are the shell's to add, read
from /proc: :mod:`..observe.usage`).

The stages report their counters to the hub (:class:`~offbroadway.stages.wire.commands.Stats`,
``Done``, ``Settled``); :class:`Board` keeps the last report of each and the totals over
restarts (:mod:`.totals`), and reads from them what ``status``, the end-of-run lines and
the "waiting for its source" notice need.  The tree is walked, here and wherever the
answer is read, with the supervision library's snapshot walks
(:func:`~offbroadway.supervision.tree.snapshot_nodes` and its siblings).
"""

from __future__ import annotations

import time

from offbroadway.supervision.tree import snapshot_nodes

from .topology import Topology
from .totals import StageTotals

#: the terminator's node in ``status``: it runs inside the daemon (interface contract §10)
TERMINATOR = "terminator"


class Board:
    """The stages' last reports and the totals over their restarts."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        #: stage id -> its last report's counters, with ``at`` (when it came)
        self.stats: dict[str, dict] = {}
        self.totals = StageTotals()
        #: stage id -> (pid, counts) of its last incarnation whose tally was taken
        self._words: dict[str, tuple[int, dict[str, int]]] = {}

    def record(self, stage_id: str, stats: dict) -> None:
        words = self._words.get(stage_id)
        if words is not None and words[0] == stats.get("pid"):
            # a report of an incarnation whose tally was taken, read only now: its counts
            # are no later than the tally's
            stats = {**stats, **words[1]}
        # a late last report of an earlier incarnation counts in the totals only
        if self.totals.report(stage_id, stats):
            self.stats[stage_id] = {**stats, "at": time.time()}

    def last_words(self, stage_id: str, pid: int, counts: dict[str, int]) -> None:
        """The counts an exited incarnation (``pid``) kept in its tally file
        (:mod:`offbroadway.stages.runtime.tally`), taken as its last report: written
        before each report it sent and after each settlement, they are at least as recent
        as any report of it, and a SIGKILL let it send none as it died.  The rest of its
        figures are its last report's.  A source that counts its failed messages itself
        (``failures`` in its figures) is read from its own figures, not ``failed``."""
        last = self.stats.get(stage_id)
        base = {k: v for k, v in last.items() if k != "at"} \
            if last is not None and last.get("pid") == pid else {}
        src = base.get("source")
        if isinstance(src, dict) and "failures" in src:
            counts = {k: v for k, v in counts.items() if k != "failed"}
        self._words[stage_id] = (pid, counts)
        self.record(stage_id, {**base, **counts, "pid": pid})

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
        """The supervision tree as ``status`` shows it: the terminator's node and each
        stage's last counters (``messages``); the shell adds each process's memory and CPU
        (:func:`..observe.usage.annotate`)."""
        snapshot["children"].append({
            "id": TERMINATOR, "kind": "worker", "strategy": None, "pid": None,
            "state": terminator_state, "restarts": 0, "children": []})
        for node in snapshot_nodes(snapshot):
            stats = self.stats.get(node["id"])
            if stats is not None:
                node["messages"] = {k: v for k, v in stats.items() if k != "at"}
        return snapshot
