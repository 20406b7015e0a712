"""The drain and the stop against the clock: the shell of :mod:`..core.terminator`.

The terminator is a pure state machine: it says whom to tell what and when the drain has
ended.  This runs it in time: the drain bounded by ``pipeline.shutdown_timeout`` (or cut
short by a third Ctrl-C), the books printed at its end and the ``--until-idle`` exit code
they call for, the run again when a crash during the drain sent messages back to the
source, and the stop of the tree within the stop budget announced to systemd
(:mod:`..core.stopbudget`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from offbroadway.supervision import Supervisor
from offbroadway.supervision.tree import SpecTree

from ..core import outcome as outcome_mod
from ..core import stopbudget
from ..core.pipeline import PipelineState, TreeHandle, failure_books
from ..core.reactions import Send
from ..core.terminator import Phase
from .notify import Notifier

log = logging.getLogger("offbroadway.daemon")

#: how long a complete drain waits for the sources' books to show nothing owed (two of the
#: stages' report ticks)
SETTLE_GRACE = 2.5


class Drainer:
    """The drain's clock and its books.  ``send`` delivers commands to the stages (the
    hub); ``stopping`` says whether a stop was asked for (rather than ``--until-idle``)."""

    def __init__(self, state: PipelineState, tree: TreeHandle, notifier: Notifier,
                 send: Callable[[list[Send]], None], stopping: Callable[[], bool],
                 until_idle: bool,
                 landed: Callable[[str, int], None] = lambda _p, _n: None) -> None:
        self.state = state
        #: told the acks in doubt of a producer that landed (its dead incarnations' metrics)
        self.landed = landed
        self.tree = tree
        self.notifier = notifier
        self.send = send
        self.stopping = stopping
        self.until_idle = until_idle
        #: set whenever the terminator may have moved (the drain's waits wake on it)
        self.progress = asyncio.Event()
        #: a third Ctrl-C: every wait ends now
        self.abort = False
        #: the books at the end of the last drain
        self.outcome: outcome_mod.Outcome | None = None
        self._stop_deadline: float | None = None
        #: why the next run again runs, if not a crash or a lost connection in the drain
        self.again_why: str | None = None

    def cut_short(self) -> None:
        """Stop waiting for what is in flight (it stays unacked at the source)."""
        self.abort = True
        self.progress.set()

    async def wait_for(self, predicate: Callable[[], bool], deadline: float) -> bool:
        """Until ``predicate()`` (True), the deadline or a cut short (False), waking
        whenever the pipeline may have moved."""
        while not predicate():
            if self.abort:
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.progress.clear()
            try:
                await asyncio.wait_for(self.progress.wait(), min(remaining, 0.5))
            except TimeoutError:
                pass
        return True

    async def drain(self) -> None:
        """Broadway's shutdown cascade (:mod:`..core.terminator`), bounded by
        ``pipeline.shutdown_timeout``."""
        timeout = self.state.config.pipeline.shutdown_timeout
        deadline = time.monotonic() + timeout
        self.notifier.stopping()
        self.announce_stop()
        self.notifier.status("draining")
        t = self.state.terminator
        began = time.monotonic()
        self.send(t.begin())
        if not await self.wait_for(lambda: t.ended, deadline):
            # the deadline, or a third Ctrl-C: say which, and after how long it really was
            why = ("stopped at once (third Ctrl-C)" if self.abort else
                   f"shutdown_timeout {timeout:g}s passed")
            for line in t.expire():
                log.warning("drain: %s after %.1fs: %s", why, time.monotonic() - began, line)
        if t.phase is Phase.COMPLETE:
            # the summary and the exit code read the books.  A source that settles through
            # an I/O thread of its own (RabbitMQ, NATS) can still count its last acks as
            # owed in the report that said "settled": its next report, within a tick, has
            # them applied; a stop's summary waits for them as --until-idle's does (a
            # source that loses its connection meanwhile makes the drain requeued)
            await self.wait_for(lambda: not self.state.outcome().unacked
                                or t.phase is not Phase.COMPLETE,
                                time.monotonic() + SETTLE_GRACE)
        if t.phase is Phase.COMPLETE and self.until_idle and not self.stopping():
            unread = self.state.unread_sources()
            if unread:
                # the exit code's guard: --until-idle ends once every source was read
                self.again_why = (f"{', '.join(unread)} not read to the end when the "
                                  "drain completed")
                t.unread()
        if t.phase is Phase.REQUEUED and self.until_idle and not self.stopping():
            return   # not complete: run again (see run_again)
        log.info("drain complete" if t.phase is Phase.COMPLETE else
                 "drain cut short by a third Ctrl-C" if self.abort else
                 "drain ended with messages back at the source (a crash or a lost broker "
                 "connection during it): they are delivered again next run"
                 if t.phase is Phase.REQUEUED else
                 "drain ended at shutdown_timeout")
        if t.phase is Phase.COMPLETE:
            # every message of the run settled: acks in doubt whose messages never came
            # back were applied by the broker (daemon/core/failing.py)
            for p, n in self.state.land_doubts().items():
                log.info("%s: the %d ack(s) in doubt never came back: the broker got them",
                         p, n)
                self.landed(p, n)
        board = self.state.board
        for p in self.state.topology.producers:
            # each source's books as the summary adds them up (over its producer's
            # restarts): what an operator checks after a stop
            src = board.source(p)
            if src:
                log.info("%s: source %s fetched %s, acked %s, failed %s, unacked %s", p,
                         src.get("source"), board.sum([p], "in"), board.sum([p], "acked"),
                         failure_books(board, [p], self.state.ledger, whole=False).failed,
                         src.get("unacked"))
        self.outcome = self.state.outcome()
        for line in self.outcome.lines():
            print(line, flush=True)

    async def run_again(self) -> None:
        """``--until-idle`` promises an exit once every message is written and acked.  A
        stage that died during the drain had its messages requeued at the source, where the
        drained producers would leave them: the pipeline (producers and all after them; a
        Spark server stays) is restarted out of the drain and runs until idle again."""
        why = self.again_why or ("messages went back to the source during the drain (a "
                                 "stage died, or a source lost its broker connection)")
        self.again_why = None
        log.warning("pipeline %s: %s; running again until idle, so that every message is "
                    "written and acked before exiting", self.state.config.pipeline.name, why)
        if self.state.terminator.reset():
            # stages still in drain mode would leave the requeued messages at the source:
            # restart the sources' supervisor, and so (rest_for_one) all after them
            topology = self.state.topology
            await self.tree.restart(SpecTree(topology.root).parent_of(topology.sources[0]).id)
        # else every drained stage is gone (a Spark server's restart takes the whole
        # pipeline along): their successors start undrained, no second restart needed
        self.notifier.status("running (again after a crash during the drain)")

    def until_idle_exit(self) -> int:
        """``--until-idle`` after the drain: the exit code the books call for, or exit 1
        if the drain did not finish in time."""
        name = self.state.config.pipeline.name
        if self.state.terminator.phase is Phase.EXPIRED:
            # --until-idle promises every message written and acked: say that it was not,
            # and exit non-zero (nothing is lost: the source keeps them)
            log.error("pipeline %s: --until-idle: the drain did not finish within "
                      "shutdown_timeout %gs; what was in flight stays unacked at the "
                      "source and is delivered again at the next run; exiting 1",
                      name, self.state.config.pipeline.shutdown_timeout)
            self.notifier.status("drain incomplete")
            return outcome_mod.EXIT_UNACKED
        assert self.outcome is not None   # drain() took the books
        code, line = self.outcome.until_idle_exit()
        if line:
            # messages left unacked broke --until-idle's promise (ERROR); failed messages
            # are the handler's verdicts, where the failure policy put them (WARNING)
            log.log(logging.ERROR if code == outcome_mod.EXIT_UNACKED else logging.WARNING,
                    "pipeline %s: %s", name, line)
            self.notifier.status("messages left unacked" if code == outcome_mod.EXIT_UNACKED
                                 else "some messages failed")
        return code

    # -- the stop budget --------------------------------------------------------------------
    def announce_stop(self) -> None:
        """Tell systemd once, in full, how long this stop may take (the stop budget)."""
        if self._stop_deadline is None:
            self._stop_deadline = time.monotonic() + self.state.stop_budget
            self.notifier.extend_timeout(self.state.stop_budget)

    async def stop_tree(self, root: Supervisor) -> None:
        """Stop the tree within what is left of the budget; past it, SIGKILL the rest."""
        assert self._stop_deadline is not None
        left = self._stop_deadline - time.monotonic() - stopbudget.MARGIN
        try:
            await asyncio.wait_for(asyncio.shield(root.stop()), max(left, 0.1))
        except TimeoutError:
            log.error("stop budget of %.0fs spent: SIGKILL to every stage still running",
                      self.state.stop_budget)
            root.kill_now()
            await root.stop()
