"""Facts about a tree of child specs, read where the supervisors' rules live, and the
walks of a live tree's snapshot.

Whoever steers a supervised system (the daemon's reactions, an operator's restart, a chaos
bench that predicts restart counters) needs to know what a crash will do before the
supervisors do it: which node's restart a crash amounts to, and which workers that
restart stops and starts.  OTP answers this inside the supervisor (``children_map``,
``find_child``, escalation inside ``restart/2``); these functions answer it from the same
specs and the same strategy table (:func:`.strategy.affected`), so no caller models the
rules a second time.  Pure: specs in, ids out, no process or clock.

The live tree has one shape outside the supervisors: the snapshot
(:meth:`.supervisor.Supervisor.snapshot`: nested dicts with ``id``, ``kind``, ``state``,
``pid``, ``restarts`` and ``children``), which the daemon's ``status`` answer carries as
its ``tree``, each node with the stage's counters (``messages``) and its memory and CPU
added.  Whoever reads that answer (the daemon's status, metrics, operator verbs, command
line and page, the benches) walks it with :func:`snapshot_nodes`, :func:`snapshot_lineage`
and :func:`snapshot_find`, never by hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from .spec import BRUTAL_KILL, INFINITY, ChildSpec, SupervisorSpec, WorkerSpec
from .strategy import affected


def walk(node: ChildSpec) -> Iterator[ChildSpec]:
    """``node`` and every spec below it, depth first in start order."""
    yield node
    if isinstance(node, SupervisorSpec):
        for child in node.children:
            yield from walk(child)


def workers_under(node: ChildSpec) -> list[WorkerSpec]:
    """The worker specs of ``node``'s subtree (``node`` itself if it is one), in start
    order."""
    return [n for n in walk(node) if isinstance(n, WorkerSpec)]


def stop_bound(spec: ChildSpec, kill_slack: float) -> float:
    """Upper bound in seconds on stopping ``spec`` as a supervisor does (``inf`` if some
    child may wait forever): children stop one after the other in reverse start order,
    each a worker's ``shutdown`` grace after SIGTERM, then SIGKILL and ``kill_slack`` to be
    reaped; a supervisor past its own ``shutdown`` SIGKILLs what is left of its subtree."""
    if isinstance(spec, WorkerSpec):
        own = spec.shutdown
        if own == BRUTAL_KILL:
            return kill_slack
        if own == INFINITY:
            return float("inf")
        return float(own) + kill_slack
    children = sum(stop_bound(child, kill_slack) for child in spec.children)
    if spec.shutdown == BRUTAL_KILL:
        return kill_slack * max(1, len(spec.children))
    if spec.shutdown == INFINITY:
        return children
    # past its own shutdown the subtree is SIGKILLed at once
    return min(children, float(spec.shutdown) + kill_slack * max(1, len(spec.children)))


class SpecTree:
    """One spec tree indexed once: parent links and nodes by id (read-only)."""

    def __init__(self, root: SupervisorSpec) -> None:
        self.root = root
        self.node: dict[str, ChildSpec] = {}
        self.parent: dict[str, SupervisorSpec] = {}
        for spec in walk(root):
            self.node[spec.id] = spec
            if isinstance(spec, SupervisorSpec):
                for child in spec.children:
                    self.parent[child.id] = spec

    def parent_of(self, child_id: str) -> SupervisorSpec | None:
        """The supervisor of ``child_id``; None for the root (or an unknown id)."""
        return self.parent.get(child_id)

    def workers(self, ids: Iterable[str]) -> list[str]:
        """The ids of the workers under the nodes ``ids`` (unknown ids are skipped: an
        event may name a child a newer spec no longer has)."""
        return [w.id for cid in ids if cid in self.node for w in workers_under(self.node[cid])]

    def crash_target(self, child_id: str) -> tuple[SupervisorSpec | None, str]:
        """Who absorbs a crash of ``child_id``: the supervisor whose strategy and restart
        intensity it reaches, and the child of that supervisor seen failing.  A supervisor
        that allows no restart (``max_restarts`` 0) gives up at once and its parent handles
        it as a failed child (OTP's escalation); the root has no parent (None)."""
        node = child_id
        while node in self.parent:
            parent = self.parent[node]
            if parent.max_restarts != 0 or parent.id not in self.parent:
                return parent, node
            node = parent.id
        return None, node

    def restart_target(self, child_id: str) -> str:
        """The node whose restart by its parent is what a crash of ``child_id`` amounts
        to; restarting it (an operator's restart) causes the same cascade as the crash."""
        return self.crash_target(child_id)[1]

    def restarted_by(self, child_id: str) -> list[str]:
        """The children of the absorbing supervisor (:meth:`crash_target`) that a crash of
        ``child_id`` restarts, in start order: its strategy applied to the failed child."""
        sup, failed = self.crash_target(child_id)
        if sup is None:
            return [failed]
        return affected(sup.strategy, [c.id for c in sup.children], failed)

    def cascade(self, child_id: str) -> list[str]:
        """The workers that stop and start again when ``child_id`` crashes (or an operator
        restarts it), in start order."""
        return self.workers(self.restarted_by(child_id))


# -- snapshots: the live tree as Supervisor.snapshot() gives it (``status``'s ``tree``) --

def snapshot_nodes(snapshot: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of a tree snapshot, depth first in start order, the root first."""
    yield snapshot
    for child in snapshot.get("children", ()):
        yield from snapshot_nodes(child)


def snapshot_lineage(snapshot: dict[str, Any], _above: tuple[dict[str, Any], ...] = ()
                     ) -> Iterator[tuple[dict[str, Any], tuple[dict[str, Any], ...]]]:
    """Every node of a tree snapshot with its ancestors (the root first, the parent last;
    a node's depth is their number), in the order of :func:`snapshot_nodes`."""
    yield snapshot, _above
    below = (*_above, snapshot)
    for child in snapshot.get("children", ()):
        yield from snapshot_lineage(child, below)


def snapshot_find(snapshot: dict[str, Any], child_id: str) -> dict[str, Any] | None:
    """The node of a tree snapshot with id ``child_id``, or None."""
    return next((n for n in snapshot_nodes(snapshot) if n["id"] == child_id), None)
