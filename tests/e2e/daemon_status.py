"""A running daemon as the e2e tests read it: its tree's nodes, a producer's books, the
tree's memory.

Status is asked over the control socket in-process (what ``offbroadway status --json``
prints, without starting a Python process per sample: under load that start took longer
than the runs being sampled).  Stage figures come from the stages' reports, once a second:
a sample is as old as the last report, which is why tests wait for a condition on them
instead of reading one sample at one moment.
"""

from __future__ import annotations

from pathlib import Path

import psutil


def tree_nodes(sock: Path) -> dict[str, dict]:
    """Every node of the live supervision tree, by id."""
    from offbroadway.daemon.cli import control
    from offbroadway.supervision.tree import snapshot_nodes

    tree = control.request(str(sock), {"cmd": "status"}, timeout=10)["status"]["tree"]
    return {node["id"]: node for node in snapshot_nodes(tree)}


def producer_books(sock: Path, producer: str = "producer_0") -> dict:
    """A producer's source stats with the producer's own ``inflight`` and ``acked``
    ({} before its first report)."""
    m = tree_nodes(sock)[producer].get("messages") or {}
    if "source" not in m:
        return {}
    return {**m["source"], "inflight": m["inflight"], "acked": m["acked"]}


def tree_rss(pid: int) -> int:
    """Resident memory of a process and all its descendants, in bytes."""
    proc = psutil.Process(pid)
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total
