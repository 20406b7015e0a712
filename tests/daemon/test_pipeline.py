"""The running pipeline's one owner (daemon/core/pipeline.py), without processes: one adopt for
start, reload and resize; the tree takes the new specs through change_spec (a stage started
later has the new values); who is leaving is kept once; the stop budget needs no daemon."""

from __future__ import annotations

import asyncio
import dataclasses

from offbroadway.daemon.config.load import validate
from offbroadway.daemon.core import stopbudget
from offbroadway.daemon.core.pipeline import PipelineState, TreeHandle, adopt
from offbroadway.daemon.spark.wiring import Wiring, stop_budget
from offbroadway.stages.runtime.logs import LEVEL_ENV
from offbroadway.stages.runtime.spec import STAGE_ENV, StageSpec
from offbroadway.stages.wire import commands
from offbroadway.supervision import Supervisor


def _config(processors: int = 2, batch_size: int = 10):
    return validate({
        "pipeline": {"name": "t", "handler": "examples.orders:Orders"},
        "producer": {"source": "spool", "options": {"path": "var/spool"}, "concurrency": 2},
        "processors": {"default": {"concurrency": processors}},
        "batchers": {"b": {"batch_size": batch_size, "concurrency": 2}},
        "runtime": {"dir": "/tmp/ob-run"},
    }).config


def _state(config=None) -> PipelineState:
    config = config or _config()
    return PipelineState(config, Wiring(config))


def _spec_of(tree: TreeHandle, sid: str) -> StageSpec:
    env = tree.find(sid).spec.env()
    return StageSpec.from_env({STAGE_ENV: env[STAGE_ENV]})


def test_the_state_at_start_is_the_configs_and_everything_reads_one_topology() -> None:
    config = _config()
    state = _state(config)
    t = state.topology
    assert state.config is config and state.file_config is config
    assert state.reactions.topology is t and state.terminator.topology is t
    assert state.board.topology is t
    assert state.stop_budget == stopbudget.total(config.pipeline.shutdown_timeout, t.root)
    # computed without building a daemon, from the same wired tree
    assert stop_budget(config) == state.stop_budget


def test_a_reload_reaches_the_stages_started_later_through_change_spec() -> None:
    async def run() -> None:
        state = _state()
        tree = TreeHandle(Supervisor(state.topology.root))
        assert _spec_of(tree, "batcher_b").batch_size == 10
        new = _config(batch_size=20)
        await adopt(state, tree, new)
        assert state.config is new
        # the running tree's node carries the new spec: its next start has batch_size 20
        assert _spec_of(tree, "batcher_b").batch_size == 20
        # and the log level a reload changed, in every stage's environment
        louder = dataclasses.replace(new, runtime=dataclasses.replace(
            new.runtime, log_level="debug"))
        await adopt(state, tree, louder)
        assert tree.find("batcher_b").spec.env()[LEVEL_ENV] == "debug"
        assert state.reactions.topology is state.topology
    asyncio.run(run())


def test_a_resize_adopts_and_keeps_who_is_leaving_once() -> None:
    async def run() -> None:
        state = _state(_config(processors=3))
        tree = TreeHandle(Supervisor(state.topology.root))
        await adopt(state, tree, _config(processors=2))
        assert state.topology.processors == ["processor_default_0", "processor_default_1"]
        # the removed processor stays in the tree until the resize removes it
        assert tree.find("processor_default_2") is not None
        assert state.is_leaving("processor_default_2")
        assert state.still_leaving() == ["processor_default_2"]
        left = state.report("processor_default_2", commands.Left(stats={}))
        assert left.progress and state.has_left("processor_default_2")
        assert state.still_leaving() == []
        # a stale "left" from a stage no resize removes moves nothing
        assert not state.report("processor_default_0", commands.Left(stats={})).progress
        state.forget(("processor_default_2",))
        assert not state.is_leaving("processor_default_2")
    asyncio.run(run())


def test_reports_feed_the_terminator_and_say_what_the_shell_must_do() -> None:
    state = _state()
    t = state.topology
    for p in t.producers:
        effects = state.report(p, commands.Idle(idle=True))
    assert effects.idle
    state.terminator.begin()
    assert state.report(t.batch_processors[0], commands.Done(stats={})).progress
    hello = state.report(t.producers[0], commands.Hello(pid=1))
    assert [s.command.NAME for s in hello.sends] == ["shutdown"]


def test_a_config_with_other_values_builds_another_topology() -> None:
    state = _state()
    again = state.wire(dataclasses.replace(state.config))
    assert again.stages == state.topology.stages and again is not state.topology


def test_an_idle_report_that_crossed_a_crash_requeue_begins_no_drain() -> None:
    """A producer is idle with messages in flight (the drain finishes those); a processor
    dies running one, and the producer's idle report, sent before the cascade's requeue
    reached it, is taken after the requeue went out.  Taken, it began a drain that paused
    the source with the requeued message (a poison on its way to the dead letters) back in
    the queue: ``--until-idle`` ended with it there.  It is not taken until the producer
    answers the requeue (``Idle(False)``, then its next tick says idle again)."""
    from offbroadway.supervision import ChildExited, ChildStarted, Restarting

    state = _state(_config())
    t = state.topology
    for sid in t.stages:
        state.supervision(ChildStarted("sup", sid, 1))
    assert not state.report("producer_0", commands.Idle(idle=True)).idle
    # the crash cascade: a processor dies, its siblings and the batchers are stopped
    state.supervision(ChildExited("sup", "processor_default_0", 2, "killed by SIGSEGV", False))
    for sid in t.stages:
        if sid not in t.producers and sid != "processor_default_0":
            state.supervision(ChildExited("sup", sid, 3, "stopped", True))
    sends = state.supervision(Restarting("PipelineSupervisor", ("ProcessorSupervisor",
                                                                "BatchersSupervisor"), "x")).sends
    assert sorted(s.stage for s in sends if isinstance(s.command, commands.Requeue)) == \
        sorted(t.producers)
    # producer_1's report crossed the requeue; producer_0's too: neither is taken
    assert not state.report("producer_1", commands.Idle(idle=True)).idle
    assert not state.report("producer_0", commands.Idle(idle=True)).idle
    # both answer the requeue, then say idle when they are
    for p in t.producers:
        assert not state.report(p, commands.Idle(idle=False)).idle
    assert not state.report("producer_0", commands.Idle(idle=True)).idle
    assert state.report("producer_1", commands.Idle(idle=True)).idle
    # a producer restarted instead owes its predecessor's answer to nobody
    state.supervision(ChildExited("sup", "processor_default_1", 4, "killed", False))
    state.supervision(Restarting("PipelineSupervisor", ("ProcessorSupervisor",), "x"))
    state.report("producer_0", commands.Hello(pid=5))
    assert not state.report("producer_0", commands.Idle(idle=True)).idle
    assert not state.report("producer_1", commands.Idle(idle=True)).idle    # owes still
