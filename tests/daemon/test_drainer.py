"""The drain's shell (daemon/shell/drainer.py) on a pipeline's state, without processes: the drain
tells the stages what the terminator says and ends when the reports say so, the books
decide the --until-idle exit, a drain past its deadline is exit 1, a third Ctrl-C ends
every wait, and a run again restarts the sources' supervisor by name."""

from __future__ import annotations

import asyncio
import time

import pytest
from offbroadway.daemon.config.load import validate
from offbroadway.daemon.core import outcome
from offbroadway.daemon.core.pipeline import PipelineState
from offbroadway.daemon.core.reactions import Send
from offbroadway.daemon.core.terminator import Phase
from offbroadway.daemon.shell.drainer import Drainer
from offbroadway.daemon.shell.notify import Notifier
from offbroadway.daemon.spark.wiring import Wiring
from offbroadway.stages.wire import commands


def _state(shutdown_timeout: float = 5.0) -> PipelineState:
    config = validate({
        "pipeline": {"name": "t", "handler": "examples.orders:Orders",
                     "shutdown_timeout": shutdown_timeout},
        "producer": {"source": "spool", "options": {"path": "var/spool"}},
        "batchers": {"b": {"batch_size": 10}},
        "runtime": {"dir": "/tmp/ob-run"},
    }).config
    return PipelineState(config, Wiring(config))


class _Tree:
    """The one thing a run again does to the tree: restart a node by name."""

    def __init__(self) -> None:
        self.restarted: list[str] = []

    async def restart(self, child_id: str) -> None:
        self.restarted.append(child_id)


def _drainer(state: PipelineState, sent: list[Send], tree: _Tree | None = None,
             until_idle: bool = True) -> Drainer:
    return Drainer(state, tree or _Tree(), Notifier(None), sent.extend,  # type: ignore[arg-type]
                   lambda: False, until_idle)


def test_a_drain_tells_the_stages_and_ends_on_their_reports() -> None:
    state, sent = _state(), []
    drainer = _drainer(state, sent)
    t = state.topology

    async def run() -> None:
        drain = asyncio.ensure_future(drainer.drain())
        await asyncio.sleep(0.05)
        assert {s.command.NAME for s in sent} == {"shutdown", "no_resubscribe"}
        for stage in t.last:
            state.report(stage, commands.Done(stats={}))
        for p in t.sources:
            state.report(p, commands.Settled(stats={}))
        drainer.progress.set()
        await asyncio.wait_for(drain, 5)
    asyncio.run(run())
    assert state.terminator.phase is Phase.COMPLETE
    assert drainer.until_idle_exit() == 0


def test_a_drain_past_its_deadline_is_exit_1_and_a_third_ctrl_c_ends_every_wait() -> None:
    state = _state(shutdown_timeout=0.2)
    drainer = _drainer(state, [])

    async def run() -> bool:
        await drainer.drain()
        assert state.terminator.phase is Phase.EXPIRED
        assert drainer.until_idle_exit() == outcome.EXIT_UNACKED
        wait = asyncio.ensure_future(drainer.wait_for(lambda: False, time.monotonic() + 30))
        await asyncio.sleep(0.05)
        drainer.cut_short()
        return await asyncio.wait_for(wait, 2)
    assert asyncio.run(run()) is False


def test_a_run_again_restarts_the_sources_supervisor_by_name() -> None:
    state, tree = _state(), _Tree()
    drainer = _drainer(state, [], tree)
    state.terminator.begin()          # the producers are told to drain
    state.terminator.requeued()
    asyncio.run(drainer.run_again())
    assert tree.restarted == ["ProducerSupervisor"]
    assert state.terminator.phase is Phase.RUNNING



@pytest.mark.parametrize(("until_idle", "unread"), [(True, True), (True, False),
                                                    (False, True)])
def test_a_complete_drain_whose_source_was_not_read_to_the_end_runs_again(
        until_idle: bool, unread: bool) -> None:
    """The exit code's guard: a drain can only begin once every source said idle, but if
    one ends complete with a source whose last report says it was not read to the end
    (a spool file still being read), ``--until-idle`` runs again instead of exiting 0
    with those lines never read; a stop ends as it did."""
    state, sent = _state(), []
    drainer = _drainer(state, sent, until_idle=until_idle)
    t = state.topology

    async def run() -> None:
        drain = asyncio.ensure_future(drainer.drain())
        await asyncio.sleep(0.05)
        for stage in t.last:
            state.report(stage, commands.Done(stats={}))
        for p in t.sources:
            state.report(p, commands.Settled(stats={
                "pid": 1, "source": {"source": "spool", "unacked": 0,
                                     "exhausted": not unread}}))
        drainer.progress.set()
        await asyncio.wait_for(drain, 5)
    asyncio.run(run())
    again = until_idle and unread
    assert state.terminator.phase is (Phase.REQUEUED if again else Phase.COMPLETE)
    assert drainer.again_why == ("producer_0 not read to the end when the drain completed"
                                 if again else None)
    if again:
        asyncio.run(drainer.run_again())
        assert drainer.again_why is None and state.terminator.phase is Phase.RUNNING
