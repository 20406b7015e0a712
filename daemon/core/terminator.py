"""Broadway's terminator: when to drain, and the drain itself, as a pure state machine.

Broadway ends a pipeline with a process of its own (``Broadway.Topology.Terminator``): it
tells the processors not to resubscribe, tells the producers to stop fetching and flush,
waits for the last stages to finish, and only then lets the supervisors stop the tree.
Ours is this class inside the daemon (``pid: null`` in ``status``).  It does no I/O: the
stages' reports and the supervision events go in, the commands to send and the phase come
out, and the daemon's shell (:mod:`..shell.app`) sends them, keeps the clock and logs.

Everything follows from the topology data: the stages that read sources
(:attr:`Topology.sources`) are told :class:`~offbroadway.stages.wire.commands.Shutdown`, their
consumers (:attr:`Topology.first`) :class:`~offbroadway.stages.wire.commands.NoResubscribe`;
the drain waits for :class:`~offbroadway.stages.wire.commands.Done` from every finisher (a
stage that acks and that nothing consumes: :attr:`Topology.last`), then for
:class:`~offbroadway.stages.wire.commands.Settled` from every
source (nothing left in flight: its last acks reached the source).

Phases::

    RUNNING --begin--> FINISHING --all finishers done--> SETTLING --all settled--> COMPLETE
                           |                                |
                           +------ a cascade requeued ------+--> REQUEUED
                           +------ the deadline (shell) ----+--> EXPIRED

``REQUEUED``: a stage died during the drain and the crash's requeue handed messages back to
the source (or the restart took producers along, whose sources took back what they had in
flight: a Spark server's restart restarts them all), or a source lost its broker connection
and the broker took back what it held (:meth:`taken_back`), so the drain cannot end with
everything acked; under ``--until-idle`` the daemon runs the pipeline again (:meth:`reset`
says which drained stages still run and must be restarted for that), otherwise it stops
with those messages unacked at the source.  ``EXPIRED`` under ``--until-idle`` is an exit
1: the promise "every message written and acked" was not kept.  A stage that (re)starts
while draining is brought into the drain on its hello.

Before the drain, with ``--until-idle``: every source idle (:class:`Idle` reports) is the
signal to begin; a downstream stage's exit (a crash cascade) forgets what was said, since
its messages come back to the source, and a source's exit forgets its own (what it had in
flight is back at its source; reports of the dead incarnation still on their way are
ignored until its successor's hello).  A producer says idle with messages in flight (the
drain finishes those), so its report and the cascade's requeue cross on the way: an idle
report sent before the requeue reached the producer, taken after the exit, would begin a
drain while what the requeue handed back (a poison message about to be failed) sits at
the source.  So a source sent a requeue counts as not idle until it answers the requeue
(its ``Idle(False)``, :meth:`requeue_sent`).

Only the drain's own reports count: the stages a drain told to finish keep running until
a run again restarts them, and their ``Done`` and ``Settled`` after :meth:`reset` speak of
the drain that ended, not of the next one (taken, they ended it at once, with a crash's
requeue still on its way).
"""

from __future__ import annotations

from enum import Enum

from offbroadway.stages.wire import commands

from .reactions import Send
from .topology import Topology


class Phase(Enum):
    RUNNING = "running"
    FINISHING = "finishing"
    SETTLING = "settling"
    COMPLETE = "complete"
    REQUEUED = "requeued"
    EXPIRED = "expired"


#: phases in which the drain is under way (a stage starting is brought into it)
WAITING = (Phase.FINISHING, Phase.SETTLING)


class Terminator:
    def __init__(self, topology: Topology) -> None:
        self.phase = Phase.RUNNING
        self.idle: dict[str, bool] = {}
        self.done: set[str] = set()
        self.settled: set[str] = set()
        #: stages told to drain that have not exited since (a run again restarts them)
        self.drained: set[str] = set()
        #: sources sent a requeue that have not answered it yet (see :meth:`requeue_sent`)
        self.owed: set[str] = set()
        #: sources that exited and whose successor has not said hello yet (see :meth:`exited`)
        self.down: set[str] = set()
        self.adopt(topology)

    def adopt(self, topology: Topology) -> None:
        """The pipeline's shape (at start, and after a resize): whom the drain tells what
        and waits for.  What stages no longer in it reported is forgotten, so a stage
        that a later resize adds again under the same id is waited for afresh."""
        self.topology = topology
        self.sources = list(topology.sources)
        self.finishers = list(topology.last)
        self._no_resubscribe = set(topology.first)
        live = set(topology.specs)
        self.done &= live
        self.settled &= live
        self.drained &= live
        self.idle = {s: v for s, v in self.idle.items() if s in live}
        self.down &= live
        self._advance()

    # -- before the drain -----------------------------------------------------------------
    def idle_report(self, stage_id: str, idle: bool) -> bool:
        """A source's idleness changed; True when every source is idle (``--until-idle``
        begins the drain then)."""
        if stage_id in self.down:
            return False            # sent by an incarnation that has exited since: stale
        if stage_id in self.owed:
            if idle:
                return False        # said before our requeue reached it: stale
            self.owed.discard(stage_id)
        self.idle[stage_id] = idle
        return self.all_idle

    @property
    def all_idle(self) -> bool:
        """Every source said it is idle, and none has exited since: the shell checks it
        again when it is about to begin the drain, since a source may die in between."""
        return bool(self.sources) and all(self.idle.get(p) for p in self.sources)

    def requeue_sent(self, stage_id: str) -> None:
        """A crash's requeue went to the source ``stage_id``: what it had in flight is back
        at the source (a poison message among it, to be failed on its next delivery), so
        it is not idle, whatever it said before.  Its answer, ``Idle(False)`` sent once it
        has requeued, ends that (the reports of one stage arrive in order: any later idle
        report knows of the requeue); so does its restart (:meth:`hello`)."""
        self.owed.add(stage_id)
        self.idle.pop(stage_id, None)

    def exited(self, stage_id: str) -> None:
        """A worker exited: if it held messages (downstream, or the Spark server its
        committers write through), what the sources said about idleness is stale.  So is
        a source's own: it said idle with messages in flight, which its death puts back at
        the source (the spool's unsettled lines, the broker's unacked messages), and a
        report it sent before dying may still be on its way; its successor speaks for it
        after its hello."""
        self.drained.discard(stage_id)
        if stage_id in self.sources:
            self.idle.pop(stage_id, None)
            self.down.add(stage_id)
        if self.topology.is_downstream(stage_id) or stage_id == self.topology.spark:
            self.idle.clear()

    # -- the drain ------------------------------------------------------------------------
    @property
    def draining(self) -> bool:
        return self.phase is not Phase.RUNNING

    def begin(self) -> list[Send]:
        """Start the drain: every stage's drain command."""
        self.phase = Phase.FINISHING
        # consumers first: none resubscribes to a source that restarts from here on
        order = [s for s in self.topology.specs if s not in self.sources] + self.sources
        out = [s for sid in order for s in self._command(sid)]
        self._advance()
        return out

    def hello(self, stage_id: str) -> list[Send]:
        """A stage (re)started: during the drain it is brought into it too.  A new
        incarnation owes no answer to its predecessor's requeue, and its idle reports
        count."""
        self.owed.discard(stage_id)
        self.down.discard(stage_id)
        return self._command(stage_id) if self.phase in WAITING else []

    def report_done(self, stage_id: str) -> None:
        if self.phase in WAITING:     # else a drained stage of a drain that ended
            self.done.add(stage_id)
            self._advance()

    def report_settled(self, stage_id: str) -> None:
        if self.phase in WAITING:     # else a drained source of a drain that ended
            self.settled.add(stage_id)
            self._advance()

    def requeued(self) -> None:
        """A crash cascade handed messages back to the source: the drain cannot complete."""
        if self.phase in WAITING:
            self.phase = Phase.REQUEUED

    def taken_back(self) -> None:
        """A source took back what it held (a lost broker connection): the broker has
        those messages again.  In a drain, or after one whose books are not yet read
        (``COMPLETE``: its last acks may be among what went back), the drain cannot end
        with every message acked."""
        if self.phase in WAITING or self.phase is Phase.COMPLETE:
            self.phase = Phase.REQUEUED

    def unread(self) -> None:
        """A complete drain's sources were not all read to the end (their last reports say
        so): under ``--until-idle`` it cannot end with every message acked, so it is
        requeued and the pipeline runs again.  The drain never begins before every source
        says idle, so this is the guard of the exit code, not the rule."""
        if self.phase is Phase.COMPLETE:
            self.phase = Phase.REQUEUED

    def expire(self) -> list[str]:
        """The shutdown timeout passed: what was still missing, in words; the drain ends."""
        lines = []
        if self.phase in WAITING:
            missing = sorted(set(self.finishers) - self.done)
            if missing:
                lines.append(f"{missing} not done; their messages stay unacked at the "
                             "source and will be delivered again")
            unsettled = sorted(set(self.sources) - self.settled)
            if unsettled:
                lines.append(f"{unsettled} still had messages in flight")
            self.phase = Phase.EXPIRED
        return lines

    @property
    def ended(self) -> bool:
        return self.phase in (Phase.COMPLETE, Phase.REQUEUED, Phase.EXPIRED)

    def reset(self) -> set[str]:
        """Back to running (the pipeline runs again after a requeued drain).  Returns the
        stages still in drain mode, which would leave the requeued messages at the source
        (empty when the restart took them all along, as a Spark server's does)."""
        self.phase = Phase.RUNNING
        self.idle.clear()
        self.done.clear()
        self.settled.clear()
        drained, self.drained = self.drained, set()
        return drained

    # -- inside ---------------------------------------------------------------------------
    def _command(self, stage_id: str) -> list[Send]:
        if stage_id in self.sources:
            self.drained.add(stage_id)
            return [Send(stage_id, commands.Shutdown())]
        if stage_id in self._no_resubscribe:
            self.drained.add(stage_id)
            return [Send(stage_id, commands.NoResubscribe())]
        return []

    def _advance(self) -> None:
        if self.phase is Phase.FINISHING and set(self.finishers) <= self.done:
            self.phase = Phase.SETTLING
        if self.phase is Phase.SETTLING and set(self.sources) <= self.settled:
            self.phase = Phase.COMPLETE
