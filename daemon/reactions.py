"""The daemon's reactions to supervision events: a pure core, tested without processes.

Broadway's rule, carried over OS processes: a stage downstream of the producers that dies
takes what it held with it, so the producers hand everything in flight back to the source
(at-least-once).  What this module decides, from the events and the supervision tree alone:

* **One requeue per crash cascade.**  A crash restarts more than the dead stage (a processor
  under ``ProcessorSupervisor``, one_for_all with max_restarts 0, escalates to the root's
  rest_for_one: every processor, batcher and batch processor goes).  Exits only record what
  was lost; the producers are told once, at the supervision event that says the cascade is
  entirely down and about to start again (:class:`~offbroadway.supervision.Restarting`,
  emitted after a restart plan's terminations, before its starts).  Every message sent to a
  doomed stage until then is in flight and comes back with that one requeue; nothing can be
  sent to a doomed stage after it, since they are all dead.  (Before, each exit sent one: up
  to P+1+B per crash, and a message failed between two of them ran ``handle_failed`` again;
  and a sibling still starting when its neighbour crashed received messages after the last
  of them, in flight forever.)
* **No requeue on a planned stop.**  A drain, ``offbroadway stop`` or ``terminate_child``
  restarts nothing, so no :class:`Restarting` follows: its exits hand nothing back (each
  stage finished or gave back what it held before exiting).
* **An operator's restart is the same cascade as a crash** of that child:
  :func:`restart_target` names the node whose restart a crash amounts to (a processor's is
  ``ProcessorSupervisor``'s, by escalation), the daemon restarts that, and the same
  :class:`Restarting` brings the same single requeue, without blame.
* **Poison blame.**  A processor that died on its own names what it was running (its blame
  record); the requeue carries it to the producer that emitted it, and ``hold`` keeps
  suspects back until every processor is up again (``release``).
* **Resubscribe only to live stages**: a restarted producer is announced to the processors
  that are up (restarting ones subscribe on their own when they start), a restarted
  processor to the batchers that are up (in a processor cascade they restart after it).

The shell (:mod:`.app`) reads the blame record, sends the commands and logs the ones a stage
could not take.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from offbroadway.stages.blame import Blame
from offbroadway.supervision.spec import ChildSpec, SupervisorSpec, WorkerSpec
from offbroadway.supervision.strategy import affected

from .topology import Topology

#: roles whose death loses messages in flight (the producers' own come back from the source)
DOWNSTREAM = ("processor", "batcher", "batch_processor")


@dataclass(frozen=True)
class Command:
    """One command for one stage, as the hub sends it."""

    stage: str
    name: str
    args: dict[str, Any] = field(default_factory=dict)


class Tree:
    """Parent links and worker lists of a supervision spec tree (read-only)."""

    def __init__(self, root: SupervisorSpec) -> None:
        self.root = root
        self.parent: dict[str, SupervisorSpec] = {}
        self.node: dict[str, ChildSpec] = {root.id: root}
        todo = [root]
        while todo:
            sup = todo.pop()
            for child in sup.children:
                self.parent[child.id] = sup
                self.node[child.id] = child
                if isinstance(child, SupervisorSpec):
                    todo.append(child)

    def workers(self, ids: Iterable[str]) -> list[str]:
        out: list[str] = []
        for cid in ids:
            spec = self.node[cid]
            if isinstance(spec, WorkerSpec):
                out.append(cid)
            else:
                out.extend(self.workers(c.id for c in spec.children))
        return out


def restart_target(tree: Tree, child_id: str) -> str:
    """The node whose restart by its parent is what a crash of ``child_id`` amounts to: a
    supervisor that allows no restart (max_restarts 0) gives up at once and its parent
    applies its own strategy to it, as OTP escalates.  An operator's restart of
    ``child_id`` restarts this node, so it causes the same cascade as the crash."""
    node = child_id
    while node in tree.parent:
        parent = tree.parent[node]
        if parent.max_restarts != 0 or parent.id not in tree.parent:
            break
        node = parent.id
    return node


def cascade(tree: Tree, child_id: str) -> list[str]:
    """The workers that stop and start again when ``child_id`` crashes (or when an operator
    restarts it)."""
    node = restart_target(tree, child_id)
    if node not in tree.parent:
        return tree.workers([node])   # the root: everything
    parent = tree.parent[node]
    return tree.workers(affected(parent.strategy, [c.id for c in parent.children], node))


def blame_entries(child_id: str, how: str, record: Blame | None) -> dict[int, dict]:
    """A dead processor's blame record, as the requeue of each producer carries it."""
    out: dict[int, dict] = {}
    if record is None:
        return out
    for s in record.suspects:
        entry = out.setdefault(s.producer, {
            "child": child_id, "how": how, "kind": record.kind,
            "frame_size": record.frame_size, "suspects": []})
        entry["suspects"].append([s.token, s.id])
    return out


class Reactions:
    """The state the reactions need: which stages are up, what was lost since the last
    requeue, and the poison blame that goes with it."""

    def __init__(self, topology: Topology, max_crashes: int = 0) -> None:
        self.topology = topology
        self.tree = Tree(topology.root)
        self.max_crashes = max_crashes
        self.alive: set[str] = set()
        #: downstream stages that exited since the last requeue (their messages are lost)
        self.lost: list[str] = []
        self._blames: dict[int, dict] = {}
        self._hold = False
        #: processors of a crash cascade not up again yet: producers hold suspects until then
        self.awaiting: set[str] = set()

    # -- events ---------------------------------------------------------------------------
    def exited(self, child_id: str, expected: bool, reason: str = "",
               record: Blame | None = None) -> list[Command]:
        """A worker exited.  ``record``: the blame record of a processor (None if none).
        Nothing is sent yet: a restart (:meth:`restarting`) or nothing (a planned stop)
        follows."""
        self.alive.discard(child_id)
        role = self.topology.roles.get(child_id)
        if role in DOWNSTREAM and child_id not in self.lost:
            self.lost.append(child_id)
        if not expected and role == "processor":
            self._add_blame(child_id, reason, record)
        return []

    def restarting(self, supervisor_id: str, children: Iterable[str] = (),
                   reason: str = "") -> list[Command]:
        """A restart plan's terminations are done: requeue once if anything was lost."""
        if not self.lost:
            return []
        why = f"{', '.join(self.lost)} down: {reason}" if reason else \
            f"{', '.join(self.lost)} down"
        out = []
        for i, p in enumerate(self.topology.producers):
            if p not in self.alive:
                continue   # restarting too: its source takes back what it had in flight
            args: dict[str, Any] = {"reason": why}
            if self._hold:
                args["hold"] = True
            if i in self._blames:
                args.update(blame=self._blames[i], max_crashes=self.max_crashes)
            out.append(Command(p, "requeue", args))
        if self._hold:
            # set now, not at the crash: a processor still starting when its neighbour
            # crashed reports started before it is stopped, and must not count as back
            self.awaiting = set(self.topology.processors) - self.alive
            if not self.awaiting:   # none restarting after all: nothing to wait for
                out += [Command(c.stage, "release") for c in out]
        self.lost, self._blames, self._hold = [], {}, False
        return out

    def started(self, child_id: str) -> list[Command]:
        self.alive.add(child_id)
        out: list[Command] = []
        role = self.topology.roles.get(child_id)
        if role == "producer":
            out += [Command(c, "resubscribe", {"producer": child_id})
                    for c in self.topology.processors if c in self.alive]
        elif role == "processor":
            out += [Command(b, "resubscribe", {"producer": child_id})
                    for b in self.topology.batchers if b in self.alive]
        if child_id in self.awaiting:
            self.awaiting.discard(child_id)
            if not self.awaiting:
                out += [Command(p, "release") for p in self.topology.producers
                        if p in self.alive]
        return out

    def operator_restart(self, child_id: str) -> str:
        """The node to restart when an operator asks for ``child_id``: the one a crash of
        ``child_id`` amounts to, so both cause the same cascade."""
        return restart_target(self.tree, child_id)

    def _add_blame(self, child_id: str, reason: str, record: Blame | None) -> None:
        if not self.max_crashes:
            return
        # one_for_all with max_restarts 0: every processor is about to restart
        self._hold = True
        for index, entry in blame_entries(child_id, reason, record).items():
            # a second processor dying on its own in the same cascade (rare): the producer
            # takes one blame per requeue, the first; the other message is requeued unstruck
            self._blames.setdefault(index, entry)
