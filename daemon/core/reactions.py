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
  :meth:`~offbroadway.supervision.tree.SpecTree.crash_target` (the supervisors' own
  answer) names the node whose restart a crash amounts to (a processor's is
  ``ProcessorSupervisor``'s, by escalation), the daemon restarts that, and the same
  :class:`Restarting` brings the same single requeue, without blame.
* **Poison blame.**  A processor that died on its own names what it was running (its blame
  record); the requeue carries it to the producer that emitted it
  (:class:`~offbroadway.stages.wire.commands.Blame`), and ``quarantine`` keeps suspects
  back until every processor is up again (``release_suspects``).
* **A resize is no crash.**  The new topology is taken at once (:meth:`Reactions.adopt`);
  a stage the resize removes drains itself first and says ``left``
  (:meth:`Reactions.left`): its exit after that is a planned stop and loses nothing.  One
  that dies before it has left is lost like any other, and until it is gone it is still
  announced a restarted upstream (so it stops waiting for that upstream's answer).
* **Resubscribe, once, to live stages** (the one path by which a consumer learns that
  its upstream restarted: its "unknown subscription" answer only voids what was out): a
  restarted stage is announced to its consumers (``StageSpec.upstream``) that are up;
  restarting ones subscribe on their own when they start, and are told at their start of
  an upstream that died while they were starting (their subscription may have reached the
  incarnation that died).  In a processor cascade the batchers restart after the
  processors: nothing to announce.

The shell (:mod:`..shell.app`) reads the blame record (:func:`.poison.read_blame`), sends the
commands and logs the ones a stage could not take; the poison state of a cascade is
:class:`.poison.Quarantine`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from offbroadway.stages.runtime.spec import StageSpec
from offbroadway.stages.wire import commands
from offbroadway.stages.wire.commands import Blame
from offbroadway.supervision import ChildExited, ChildStarted, Restarting
from offbroadway.supervision.tree import SpecTree

from .poison import Quarantine
from .topology import Topology


@dataclass(frozen=True)
class Send:
    """One command for one stage, as the hub sends it."""

    stage: str
    command: commands.Command


class Reactions:
    """The state the reactions need: which stages are up, what was lost since the last
    requeue, and the poison blame that goes with it."""

    def __init__(self, topology: Topology, max_crashes: int = 0) -> None:
        self.topology = topology
        self.tree = SpecTree(topology.root)
        self.alive: set[str] = set()
        #: downstream stages that exited since the last requeue (their messages are lost)
        self.lost: list[str] = []
        #: the stages that run messages straight from the sources (the processors): the
        #: ones whose death is blamed on what they ran, and that suspects wait for
        self.blamed = set(topology.first)
        self.poison = Quarantine(max_crashes, self.blamed)
        #: stages a resize is removing (not in :attr:`topology` any more), with their spec
        self.leaving: dict[str, StageSpec] = {}
        #: those of them that finished leaving: their exit loses nothing
        self.departed: set[str] = set()
        #: a counter of events, when each stage last went down, and when each was last
        #: about to be started again (its plan's Restarting: it is spawned after that)
        self._clock = 0
        self._down_at: dict[str, int] = {}
        self._restarted_at: dict[str, int] = {}

    # -- resizes ----------------------------------------------------------------------------
    def adopt(self, topology: Topology) -> None:
        """A resize's new topology, from now on; the stages only the old one has are
        leaving until :meth:`forget`."""
        old = self.topology
        for stage in set(old.specs) - set(topology.specs):
            self.leaving[stage] = old.specs[stage]
        self.blamed = (set(topology.first)
                       | (self.blamed & set(self.leaving)))
        self.poison.blamed = self.blamed
        self.topology = topology
        self.tree = SpecTree(topology.root)

    def left(self, child_id: str) -> bool:
        """``child_id`` said it finished leaving (it holds nothing): its coming exit is
        planned.  False if no resize is removing it (the report is stale)."""
        if child_id not in self.leaving:
            return False
        self.departed.add(child_id)
        return True

    def forget(self, stages: Iterable[str]) -> None:
        """Stages a resize removed are gone."""
        for stage in stages:
            self.leaving.pop(stage, None)
            self.departed.discard(stage)
            self.alive.discard(stage)
            self.blamed.discard(stage)

    def on_event(self, event: object, record: Blame | None = None) -> list[Send]:
        """The commands a supervision event calls for.  ``record``: the blame record of a
        worker in :attr:`blamed` that exited (None if none)."""
        if isinstance(event, ChildExited):
            return self.exited(event.child_id, event.expected, event.reason, record)
        if isinstance(event, ChildStarted):
            return self.started(event.child_id)
        if isinstance(event, Restarting):
            return self.restarting(event.supervisor_id, event.children, event.reason)
        return []

    # -- events ---------------------------------------------------------------------------
    def exited(self, child_id: str, expected: bool, reason: str = "",
               record: Blame | None = None) -> list[Send]:
        """A worker exited.  ``record``: the blame record of a processor (None if none).
        Nothing is sent yet: a restart (:meth:`restarting`) or nothing (a planned stop)
        follows."""
        self.alive.discard(child_id)
        self._clock += 1
        self._down_at[child_id] = self._clock
        if child_id in self.departed:
            return []     # left the pipeline (a resize) holding nothing: a planned stop
        downstream = self.topology.is_downstream(child_id) or child_id in self.leaving
        if downstream and child_id not in self.lost:
            self.lost.append(child_id)
        if not expected and child_id in self.blamed:
            self.poison.crashed(child_id, reason, record)
        return []

    def hands_back(self, children: Iterable[str]) -> bool:
        """Whether the restart about to start (``children`` of one supervisor) puts
        messages back at the source: a downstream stage was lost since the last requeue
        (the live producers requeue what it held), or a producer restarts (its source takes
        back what it had in flight; a Spark server restart takes every producer along).
        Ask before :meth:`restarting`, which forgets what was lost.  A drain under
        ``--until-idle`` cannot end with every message acked after such a restart."""
        if self.lost:
            return True
        sources = set(self.topology.sources)
        return any(w in sources
                   for w in self.tree.workers(children))

    def restarting(self, supervisor_id: str, children: Iterable[str] = (),
                   reason: str = "") -> list[Send]:
        """A restart plan's terminations are done: requeue once if anything was lost; and
        whenever the sources take anything back (that requeue, or a producer restarting),
        tell the live committers (:meth:`redelivery`)."""
        self._clock += 1
        workers = self.tree.workers(children)
        for w in workers:
            self._restarted_at[w] = self._clock
        sources = set(self.topology.sources)
        if not self.lost:
            restarted = [w for w in workers if w in sources]
            if not restarted:
                return []
            return self.redelivery(f"{', '.join(restarted)} restarting: {reason}"
                                   if reason else f"{', '.join(restarted)} restarting")
        why = f"{', '.join(self.lost)} down: {reason}" if reason else \
            f"{', '.join(self.lost)} down"
        # a stage a resize is removing is not waited for: the restart builds the new shape
        blames, quarantine, release = self.poison.requeue(self.alive | set(self.leaving))
        out = []
        for i, p in enumerate(self.topology.producers):
            if p not in self.alive:
                continue   # restarting too: its source takes back what it had in flight
            out.append(Send(p, commands.Requeue(reason=why, blame=blames.get(i),
                                                quarantine=quarantine)))
        if release:   # no processor restarting after all: nothing to wait for
            out += [Send(c.stage, commands.ReleaseSuspects()) for c in out]
        self.lost = []
        return out + self.redelivery(why)

    def redelivery(self, why: str) -> list[Send]:
        """The sources take back what was in flight while copies of some of it may live on
        downstream (or be committed already, their acks lost with a dead producer): every
        live committer hears it, before any stage of the restart starts, so it puts its
        recent commits and its next ones in doubt (docs/design-spark.md §5).  A committer
        that restarts too reads its journal back instead.  A producer's death is the case
        only this covers: no stage the committer talks to restarts with it."""
        return [Send(c, commands.Redelivery(reason=why)) for c in self.topology.committers
                if c in self.alive]

    def started(self, child_id: str) -> list[Send]:
        """A worker is up: its live consumers subscribe to it afresh (restarting ones
        subscribe on their own when they start); the last of a crash's processors back
        releases the producers' suspects."""
        self.alive.add(child_id)
        out = [Send(c, commands.Resubscribe(child_id))
               for c in self.topology.consumers(child_id) if c in self.alive]
        # and its own upstreams that died after it was about to start (and are up again,
        # unannounced to it): the subscription it sent at its start may have reached the
        # incarnation that died.  One that died before went to the new one.
        spec = self.topology.specs.get(child_id)
        since = self._restarted_at.get(child_id, 0)
        for up in spec.upstream if spec is not None else ():
            if up in self.alive and self._down_at.get(up, -1) > since:
                out.append(Send(child_id, commands.Resubscribe(up)))
        # a leaving stage waits for its upstreams' answers: a restarted one has none
        out += [Send(c, commands.Resubscribe(child_id)) for c, spec in self.leaving.items()
                if child_id in spec.upstream and c in self.alive]
        if self.poison.started(child_id):
            out += [Send(p, commands.ReleaseSuspects()) for p in self.topology.producers
                    if p in self.alive]
        return out

    def operator_restart(self, child_id: str) -> str:
        """The node to restart when an operator asks for ``child_id``: the one a crash of
        ``child_id`` amounts to, so both cause the same cascade."""
        return self.tree.restart_target(child_id)
