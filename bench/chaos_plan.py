"""The chaos run's kill plan: which stage may be SIGKILLed now, and whether the supervisors'
restart intensity still allows it (:class:`KillBudget`, :func:`eligible`).

Pure functions over the supervision tree the daemon builds and over ``status --json``
answers, so they are tested without processes (tests/chaos/test_chaos_books.py) and shared
with the soak (bench/soak.py).  Why a kill waits for its budget and for a status that has
seen every earlier kill: bench/chaos.py's module doc.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from offbroadway.daemon.config import names
from offbroadway.supervision.tree import SpecTree, snapshot_lineage, snapshot_nodes
from offbroadway.supervision.tree import walk as walk_specs

KINDS = ("producer", "processor", "batcher", "batch_processor", "spark")
#: A kill may be charged to a supervisor while it has taken at most max_restarts - RESERVE
#: kills in max_seconds + BUDGET_MARGIN (see the module doc).
RESERVE = 1
BUDGET_MARGIN = 2.0


@dataclass
class Kill:
    at: float                  # seconds since the run started
    incarnation: int           # 1 for the first daemon, 2 after the daemon kill
    child: str                 # child id, or "daemon"
    kind: str
    pid: int                   # the pid in status (for spark: the wrapper's)
    signalled_pid: int         # what got SIGKILL (for spark: the JVM)
    inflight: int              # producers' in flight, each at its 3 s maximum (LoadWindow)
    buffered: int
    progress: float            # fraction of the source drained, roughly
    outcome: str = "unknown"   # counted | during-stop | unknown (from the daemon's log)


# -- the pure part: the tree's books -------------------------------------------------------

def spec_tree(config_path: str) -> Any:
    """The supervision tree the daemon builds from this config (its root SupervisorSpec),
    so strategies and intensities are read, not assumed."""
    from offbroadway.daemon.config.load import load_config
    from offbroadway.daemon.spark.wiring import wired

    return wired(load_config(config_path).config).root


def charged_supervisor(root: Any, child_id: str) -> tuple[Any, str]:
    """The supervisor whose restart intensity a crash of ``child_id`` consumes, and the id
    of its child that it sees failing: asked of the supervision library
    (:meth:`~offbroadway.supervision.tree.SpecTree.crash_target`), which knows OTP's
    escalation, rather than modelled here."""
    sup, failed = SpecTree(root).crash_target(child_id)
    assert sup is not None, f"{child_id} is the root: nothing absorbs its crash"
    return sup, failed


def expected_restarts(root: Any, crashed: Iterable[str]) -> Counter:
    """Restart counters after these crashes, as ``status`` counts them: every start of a
    node after its first adds one, and a restarted supervisor starts all its children.
    Which children a crash restarts is the supervision library's answer
    (:meth:`~offbroadway.supervision.tree.SpecTree.restarted_by`)."""
    counts: Counter = Counter()
    tree = SpecTree(root)
    for child in crashed:
        for restarted in tree.restarted_by(child):
            counts.update(spec.id for spec in walk_specs(tree.node[restarted]))
    return counts


class KillBudget:
    """The killer's copy of OTP's books: which supervisor each kill is charged to, and
    whether one more kill keeps every supervisor clear of its intensity (module doc)."""

    def __init__(self, root: Any, reserve: int = RESERVE, margin: float = BUDGET_MARGIN) -> None:
        self.root = root
        self.reserve = reserve
        self.margin = margin
        self._times: dict[str, deque[float]] = {}

    def allows(self, child_id: str, now: float) -> bool:
        sup, _ = charged_supervisor(self.root, child_id)
        times = self._times.get(sup.id, deque())
        recent = sum(1 for t in times if t >= now - sup.max_seconds - self.margin)
        return recent + 1 <= sup.max_restarts - self.reserve

    def record(self, child_id: str, now: float) -> None:
        sup, _ = charged_supervisor(self.root, child_id)
        self._times.setdefault(sup.id, deque()).append(now)


def kind_of(child_id: str) -> str | None:
    """The kind of worker the bench kills: a stage's role (committers are not killed here)
    or ``spark``; None for anything else."""
    role = names.role_of(child_id)
    if role in (names.BATCH_PROCESSOR, names.PRODUCER, names.PROCESSOR, names.BATCHER):
        return role
    return "spark" if child_id == "spark" else None


def eligible(status: dict, root: Any, kinds: Iterable[str]) -> dict[str, list[dict]]:
    """Kind → running workers whose kill would be handled at once and in full: every node
    its cascade restarts is running, and so is every ancestor (module doc).

    A supervisor that is busy (restarting, or stopping a subtree after giving up) handles
    an exit late, or has the restart it is carrying out cancelled by its parent's; both
    are legitimate, but then the restart counters no longer follow from the kills alone.
    """
    out: dict[str, list[dict]] = {}
    wanted = set(kinds)
    state = {n["id"]: n["state"] for n in snapshot_nodes(status["tree"])}
    for node, ancestors in snapshot_lineage(status["tree"]):
        kind = kind_of(node["id"])
        if node["kind"] != "worker" or kind not in wanted or not node.get("pid"):
            continue
        cascade = expected_restarts(root, [node["id"]])
        if all(state.get(cid) == "running" for cid in cascade) and \
                all(a["state"] == "running" for a in ancestors):
            out.setdefault(kind, []).append(node)
    return out


def unseen_kills(status: dict, kills: Iterable[Kill]) -> list[Kill]:
    """The kills this status does not reflect yet: the killed worker still shows the pid it
    was killed under (the daemon has not read its exit; module doc).  A worker the daemon
    has seen exit shows no pid or its successor's, so this is exact, not a guess."""
    pids = {n["id"]: n.get("pid") for n in snapshot_nodes(status["tree"])}
    return [k for k in kills if k.child in pids and pids[k.child] == k.pid]


def all_running(status: dict) -> bool:
    return all(n["state"] == "running" for n in snapshot_nodes(status["tree"]))


def producer_load(status: dict) -> dict[str, tuple[int, int]]:
    """Producer id → (in flight, buffered) from its last stats report (≤ 1 s old)."""
    out = {}
    for n in snapshot_nodes(status["tree"]):
        if kind_of(n["id"]) == "producer":
            m = n.get("messages", {})
            out[n["id"]] = (int(m.get("inflight", 0)), int(m.get("buffered", 0)))
    return out


class LoadWindow:
    """The producers' in-flight counts over the last ``seconds``: the bound on what a kill
    can duplicate.  One status alone is not enough: stats are up to a second old, and a
    producer restarted a moment ago reports 0 while its predecessor's messages are still
    being written downstream.  So each producer counts with the largest figure any status
    of the window showed for it (measured: the single-status bound was exceeded)."""

    def __init__(self, seconds: float = 3.0) -> None:
        self.seconds = seconds
        self._samples: deque[tuple[float, dict[str, tuple[int, int]]]] = deque()

    def add(self, now: float, status: dict) -> None:
        self._samples.append((now, producer_load(status)))
        while self._samples and self._samples[0][0] < now - self.seconds:
            self._samples.popleft()

    def bound(self) -> tuple[int, int]:
        """(in flight, buffered), each producer at its window maximum, summed."""
        inflight: dict[str, int] = {}
        buffered: dict[str, int] = {}
        for _, load in self._samples:
            for pid, (i, b) in load.items():
                inflight[pid] = max(inflight.get(pid, 0), i)
                buffered[pid] = max(buffered.get(pid, 0), b)
        return sum(inflight.values()), sum(buffered.values())
