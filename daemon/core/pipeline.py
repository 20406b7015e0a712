"""The running pipeline's state, owned once, and the narrow handles the daemon's parts get.

A daemon runs one pipeline at a time, but its shape and values change while it runs: a
reload changes a batch size, a resize the number of processors.  Everything that follows
from the config (the topology, the reactions to crashes, the drain's terminator, the
status board and the stop budget) must change together, or a restart, a drain or a
status answer reads a pipeline that no longer runs.  :class:`PipelineState` holds them,
and :meth:`PipelineState.adopt` is the one way they change, at start, on a reload and on
a resize.  The supervision tree learns the new specs the one way OTP has for it
(``code_change`` → ``update_childspec``: :meth:`TreeHandle.change_spec`), so a stage
restarted later starts with the new values.

The operator's verbs (:mod:`..shell.operator`) and the resizer (:mod:`..shell.resizer`)
get this state, a :class:`TreeHandle` and the few things of the daemon's shell they use
(:class:`Shell`), not the daemon itself: none of them imports :mod:`..shell.app`, and each
can be read alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from offbroadway.stages.flow import ratelimit
from offbroadway.stages.runtime.spec import PROCESSOR_KEY
from offbroadway.stages.wire import commands
from offbroadway.stages.wire.commands import Blame
from offbroadway.supervision import (
    ChildExited,
    Restarting,
    SupervisionError,
    Supervisor,
)

from ..config.names import BATCH_PROCESSOR, committer_id, key_of, role_of
from ..config.records import Config
from . import outcome as outcome_mod
from . import stopbudget
from .failing import FailingLedger
from .reactions import Reactions, Send
from .status import Board
from .terminator import Terminator
from .topology import Topology


@dataclass(frozen=True)
class Effects:
    """What a report or an event calls for: commands to send, whether the drain or a
    resize may have moved (their waits wake), and whether every source is idle."""

    sends: list[Send] = field(default_factory=list)
    progress: bool = False
    idle: bool = False


class Wiring(Protocol):
    """How the daemon builds a config's tree: :func:`.topology.build` wired to its one
    Spark server (:class:`..spark.wiring.Wiring`)."""

    def build(self, config: Config) -> Topology: ...


class PipelineState:
    """The pipeline as it runs: its config, topology, reactions, terminator, board and
    stop budget.  Pure: no process, socket or clock; the shell acts on what it says."""

    def __init__(self, config: Config, wiring: Wiring) -> None:
        self.wiring = wiring
        #: the config file as last read (``config`` is the running one: a ``scale``
        #: changes it, not the file); a reload compares the file with this
        self.file_config = config
        topology = wiring.build(config)
        self.reactions = Reactions(topology, config.processors[PROCESSOR_KEY].max_crashes)
        self.terminator = Terminator(topology)
        self.board = Board(topology)
        #: the failed messages in circulation, from the producers' notes (:mod:`.failing`)
        self.ledger = FailingLedger()
        self.adopt(config, topology)

    def wire(self, config: Config) -> Topology:
        """``config``'s tree, wired as this daemon's (the one Spark server)."""
        return self.wiring.build(config)

    def adopt(self, config: Config, topology: Topology | None = None) -> Topology:
        """``config`` (and its ``topology``, built if not given) is the running pipeline
        from now on: what the drain waits for, whom the reactions tell what, what status
        lists and how long a stop may take.  The stages only the old topology has are
        leaving until :meth:`forget` (the reactions keep their specs)."""
        topology = topology if topology is not None else self.wire(config)
        self.config = config
        self.topology = topology
        self.reactions.adopt(topology)
        self.terminator.adopt(topology)
        self.board.topology = topology
        self.stop_budget = stopbudget.total(config.pipeline.shutdown_timeout, topology.root)
        return topology

    # -- what comes in ------------------------------------------------------------------------
    def report(self, stage_id: str, report: commands.Report) -> Effects:
        """A stage's report: its figures for status and the totals, and the terminator's
        and the resize's inputs."""
        sends: list[Send] = []
        if isinstance(report, (commands.Stats, commands.Done, commands.Settled,
                               commands.Left)):
            notes = report.stats.pop("notes", None)
            if notes:
                # a producer's failure-book notes: the pipeline's books, and what the
                # other producers must change in theirs (:mod:`.failing`)
                sends = self.ledger.take(stage_id, notes, self.topology.producers)
            if "pid" in report.stats:
                self.board.record(stage_id, report.stats)
        t = self.terminator
        if isinstance(report, commands.Idle):
            return Effects(idle=t.idle_report(stage_id, report.idle))
        if isinstance(report, commands.Done):
            t.report_done(stage_id)
            return Effects(sends=sends, progress=True)
        if isinstance(report, commands.Settled):
            t.report_settled(stage_id)
            return Effects(sends=sends, progress=True)
        if isinstance(report, commands.Hello):
            return Effects(sends=t.hello(stage_id))
        if isinstance(report, commands.Left):
            return Effects(sends=sends, progress=self.report_left(stage_id))
        if isinstance(report, commands.TakenBack):
            # the producer lives on, so no restart tells the committers: this does (the
            # source logged the loss; each committer logs what it checks).  In a drain,
            # what the broker took back is in its queue again, where the drained sources
            # leave it: the drain cannot end with every message acked
            t.taken_back()
            return Effects(sends=sends + self.reactions.redelivery(
                f"{stage_id}: {report.reason}"), progress=True)
        # notes can change the books the drain's summary waits on
        return Effects(sends=sends, progress=bool(sends))

    def last_notes(self, stage_id: str, notes: list[list]) -> Effects:
        """The failure-book notes an exited producer kept in its notes file, those its
        reports did not bring (a SIGKILL sends no last report): the books take them as a
        report's, and the other producers are told what changes theirs."""
        unheard = self.ledger.unheard(stage_id, notes)
        if not unheard:
            return Effects()
        return Effects(sends=self.ledger.take(stage_id, unheard, self.topology.producers),
                       progress=True)

    def last_doubt(self, stage_id: str, when: float, digests: tuple[int, ...]) -> None:
        """The ack frame an exited producer was sending as it died (its tally): in doubt
        until its messages come back or the run ends (:mod:`.failing`)."""
        self.ledger.doubt(stage_id, when, digests)

    def unread_sources(self) -> list[str]:
        """The producers whose source, as each last reported, was not read to the end
        (a spool with a file still being read or lines handed back; sources that cannot
        know, the brokers', say nothing and are not among them)."""
        return [p for p in self.topology.producers
                if self.board.source(p).get("exhausted") is False]

    def land_doubts(self) -> dict[str, int]:
        """The run's end: the acks still in doubt never came back, so the broker got
        them: into each producer's books (producer -> how many)."""
        landed = self.ledger.land_doubts()
        for stage, n in landed.items():
            self.board.totals.credit(stage, "acked", n)
        return landed

    def supervision(self, event: object, record: Blame | None = None) -> Effects:
        """A supervision event: the reactions (:mod:`.reactions`) decide what to send, and
        the terminator learns of exits and of a drain that can no longer complete.
        ``record``: the blame record of an exited worker in ``reactions.blamed``."""
        if isinstance(event, ChildExited):
            self.terminator.exited(event.child_id)
        # asked before the reactions forget what the cascade lost
        handed_back = isinstance(event, Restarting) and self.reactions.hands_back(
            event.children)
        sends = self.reactions.on_event(event, record)
        for s in sends:
            if isinstance(s.command, commands.Requeue):
                # an idle report the source sent before this reaches it is stale
                self.terminator.requeue_sent(s.stage)
        if handed_back and self.terminator.draining:
            # what the dead stages held went back to the source (requeued by the live
            # producers, or taken back by restarting ones: a Spark server's restart takes
            # every producer along): the drain cannot end with every message acked; it
            # stops waiting (the daemon runs the pipeline again under --until-idle)
            self.terminator.requeued()
            return Effects(sends=sends, progress=True)
        return Effects(sends=sends)

    def status(self, snapshot: dict, **shell: Any) -> dict:
        """``{"pipeline": NAME, "tree": NODE}`` per the interface contract (§10): the
        supervision tree's ``snapshot`` with each stage's figures, the books and the
        stages a resize is removing; ``shell`` adds the daemon's own figures (paused, rate
        limit, pid...)."""
        draining, board = self.terminator.draining, self.board
        producers = self.topology.producers
        books = failure_books(board, producers, self.ledger)
        return {"pipeline": self.config.pipeline.name,
                "tree": board.tree(snapshot, "draining" if draining else "running"),
                "draining": draining, **shell,
                "acked": board.sum(producers, "acked"),
                # acks a killed producer was sending, until the broker says (:mod:`.failing`)
                "acks_in_doubt": self.ledger.doubts(producers),
                # messages, each once; the failed deliveries and requeues apart
                "failed": books.failed,
                "failed_deliveries": books.failures,
                "requeued_failures": books.requeued,
                "failing": books.stay,
                "failed_to": board.failed_to(),
                "sources_down": board.sources_down(),
                "spark_down": board.spark_down(),
                # a resize under way: the stages it removes that are finishing what they hold
                "leaving": self.still_leaving()}

    # -- stages a resize removes --------------------------------------------------------------
    def is_leaving(self, stage_id: str) -> bool:
        return stage_id in self.reactions.leaving

    def report_left(self, stage_id: str) -> bool:
        """A stage said ``left``: True if a resize is removing it (its exit is planned)."""
        return self.reactions.left(stage_id)

    def has_left(self, stage_id: str) -> bool:
        return stage_id in self.reactions.departed

    def still_leaving(self) -> list[str]:
        """The stages a resize removes that are still finishing what they hold."""
        return sorted(set(self.reactions.leaving) - self.reactions.departed)

    def forget(self, stages: tuple[str, ...]) -> None:
        """Stages a resize removed are gone: no figures, no reactions."""
        for stage in stages:
            self.board.stats.pop(stage, None)
        self.reactions.forget(stages)

    # -- the books ------------------------------------------------------------------------------
    def outcome(self) -> outcome_mod.Outcome:
        """The run's books as the stages last reported them (:mod:`.outcome`): rows
        committed per Spark batcher (those a resize or a restart removed too), messages
        acked and failed, and what the sources still owe."""
        t, board, config = self.topology, self.board, self.config
        written = []
        spark = config.spark
        if spark is not None:
            stages = board.totals.stages()
            for key in config.batchers:
                # every batch processor that ever reported, those a resize removed too
                bps = [s for s in stages if role_of(s) == BATCH_PROCESSOR and key_of(s) == key]
                committer = [committer_id(key)]
                written.append(outcome_mod.Written(
                    key, board.sum(committer, "out"), board.sum(bps, "out"),
                    board.sum(committer, "already_written")))
        books = failure_books(board, t.producers, self.ledger)
        return outcome_mod.Outcome(
            config.pipeline.name, acked=board.sum(t.producers, "acked"),
            failed=books.failed,
            unacked=sum(int(board.source(p).get("unacked") or 0) for p in t.producers),
            failed_to=board.failed_to() if books.failed else "",
            failures_retried=books.retried, failed_deliveries=books.failures,
            requeued_failures=books.requeued, stay=books.stay, stay_in=books.stay_in,
            written=written,
            output=spark.output if spark is not None else "",
            table=spark.table if spark is not None else "",
            fmt=spark.format if spark is not None else "")


@dataclass(frozen=True)
class FailureBooks:
    """The failed messages of a run, read from the producers' reports (see
    :func:`failure_books`)."""

    #: messages failed (each once, however often it was delivered)
    failed: int = 0
    #: failed deliveries, and those of them the policy requeued for another try
    failures: int = 0
    requeued: int = 0
    #: messages back in the queue after failing (a requeuing policy), and where
    stay: int = 0
    stay_in: str = ""
    #: a source without per-message books: failures handed back for another delivery
    retried: int = 0


def failure_books(board: Board, producers: list[str], ledger: FailingLedger | None = None,
                  *, whole: bool = True) -> FailureBooks:
    """One count per message.  A source that knows its messages across deliveries (it
    reports ``failures``, the failed deliveries, beside ``failed``, the messages) is read
    from its own books, over its producer's restarts: messages rejected in every
    incarnation plus those still failing now.  Those still failing are the ``ledger``'s
    when the source notes its books to the daemon (``noted``: RabbitMQ), so a message
    that failed on one producer and was settled, or failed again, on another counts once
    as what it became; the pipeline's (``whole``) or those last failed on ``producers``.
    Others count a failure per settlement, as their producers do."""
    failed = failures = requeued = stay = retried = 0
    where: list[str] = []
    noted: list[str] = []
    for p in producers:
        src = board.source(p)
        if "failures" in src:
            if ledger is not None and src.get("noted"):
                failing = 0
                if src.get("failing_in"):
                    noted.append(src["failing_in"])
            else:
                failing = int(src.get("failing") or 0)
            failed += board.sum([p], "source.rejected") + failing
            failures += board.sum([p], "source.failures")
            requeued += board.sum([p], "source.failure_requeued")
            stay += failing
            if failing and src.get("failing_in") and src["failing_in"] not in where:
                where.append(src["failing_in"])
        else:
            n = board.sum([p], "failed")
            failed += n
            failures += n
            retried += int(src.get("failure_requeued", src.get("naked", 0)) or 0)
    if ledger is not None and noted:
        failing = ledger.count(None if whole else producers)
        failed += failing
        stay += failing
        if failing:
            where.extend(w for w in dict.fromkeys(noted) if w not in where)
    return FailureBooks(failed, failures, requeued, stay, "; ".join(where), retried)


class TreeHandle:
    """What the daemon's parts may do to the running supervision tree: look a node up,
    restart one as a crash would, change the specs, and keep the copy that other threads
    (``/metrics``) read.  The root supervisor itself stays the shell's."""

    def __init__(self, root: Supervisor) -> None:
        self._root = root
        #: the tree as last copied on the loop (the HTTP thread never reads the live one)
        self.copy: dict = root.snapshot()

    def find(self, child_id: str) -> Any:
        return self._root.find(child_id)

    def snapshot(self) -> dict:
        return self._root.snapshot()

    def refresh(self) -> None:
        self.copy = self._root.snapshot()

    async def restart(self, child_id: str) -> None:
        """Restart ``child_id`` the way its supervisor restarts it after a crash."""
        await self._root.restart_subtree_or_child(child_id)

    async def change_spec(self, topology: Topology) -> None:
        """The tree takes ``topology``'s specs (OTP's ``code_change``): nothing starts or
        stops; every start from now on uses them."""
        await self._root.change_spec(topology.root)

    def supervisor(self, sup_id: str) -> Supervisor:
        node = self._root.find(sup_id)
        if not isinstance(node, Supervisor):
            raise SupervisionError(f"not_found: no supervisor {sup_id!r}")
        return node


async def adopt(state: PipelineState, tree: TreeHandle, config: Config,
                topology: Topology | None = None) -> Topology:
    """A reload's or a resize's new pipeline, the one way: the tree takes the new specs
    first (a crash from then on restarts into the new shape and values), then the state
    follows (:meth:`PipelineState.adopt`)."""
    topology = topology if topology is not None else state.wire(config)
    await tree.change_spec(topology)
    return state.adopt(config, topology)


class History(Protocol):
    """Where the shell keeps what happened, for the live page
    (:class:`..observe.timeline.Timeline`)."""

    def add(self, kind: str, what: str, reason: str = "") -> None: ...


class Shell(Protocol):
    """What the operator's verbs and a resize ask of the daemon's shell (:mod:`..shell.app`)."""

    timeline: History
    rate_limit: ratelimit.SharedRateLimit | None

    @property
    def stopping(self) -> bool: ...

    def send(self, sends: list[Send]) -> None: ...

    def wait_for(self, predicate: Callable[[], bool], deadline: float) -> Awaitable[bool]: ...

    def request_stop(self, why: str = "stop") -> None: ...

    def reload(self, why: str = "reload") -> Awaitable[dict]: ...

    def status(self) -> dict: ...

    def rate_bucket(self) -> ratelimit.Bucket: ...
