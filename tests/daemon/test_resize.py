"""The resize planner, without processes: a request becomes a new config (or one line
naming what is wrong), two topologies become the ordered steps, and the reactions count a
stage that left as a planned stop, not a loss."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st
from offbroadway.daemon.config.load import validate
from offbroadway.daemon.core import resize
from offbroadway.daemon.core import topology as topo_mod
from offbroadway.daemon.core.reactions import Reactions
from offbroadway.daemon.core.resize import ResizeRefused, Step
from offbroadway.stages.wire import commands


def _config(processors: int = 2, bps: dict[str, int] | None = None,
            partition: bool = False, run_dir: str = "/tmp/ob-run"):
    bps = {"spark": 1} if bps is None else bps
    raw = {
        "pipeline": {"name": "t", "handler": "examples.orders:Orders"},
        "producer": {"source": "spool", "options": {"path": "var/spool"}, "concurrency": 2},
        "processors": {"default": {"concurrency": processors}},
        "batchers": {k: {"batch_size": 10, "concurrency": n} for k, n in bps.items()},
        "runtime": {"dir": run_dir},
    }
    if partition:
        raw["processors"]["default"]["partition_by"] = "route"
        for b in raw["batchers"].values():
            b["partition_by"] = "route"
    return validate(raw).config


def _ops(steps: list[Step]) -> list[tuple]:
    return [(s.op, s.stage or s.stages, s.supervisor or s.peer) for s in steps]


@pytest.mark.parametrize("words, message", [
    ([], "scale what?"),
    (["processors"], "takes one number"),
    (["processors", "0"], "must be at least 1, not 0"),
    (["processors", "-3"], "must be at least 1, not -3"),
    (["processors", "two"], "must be a whole number, not 'two'"),
    (["processors", "2.5"], "must be a whole number, not '2.5'"),
    (["processors", "2", "3"], "takes one number"),
    (["batch_processors", "4"], "takes a batcher key and the new count"),
    (["batch_processors", "spark", "x"], "must be a whole number"),
    (["producers", "3"], "cannot scale 'producers'"),
])
def test_bad_requests_are_one_line(words, message):
    with pytest.raises(ResizeRefused, match=message) as exc:
        resize.parse(words)
    assert "\n" not in str(exc.value)


def test_requests_become_configs_or_a_line_naming_the_key():
    config = _config()
    req = resize.parse(["processors", "5"])
    assert req == resize.Request("processors", "default", 5)
    assert resize.resized(config, req).processors["default"].concurrency == 5
    new = resize.resized(config, resize.parse(["batch_processors", "spark", "3"]))
    assert new.batchers["spark"].concurrency == 3 and new.processors == config.processors
    with pytest.raises(ResizeRefused, match=r"no batcher 'nope' \(batchers: spark\)"):
        resize.resized(config, resize.parse(["batch_processors", "nope", "3"]))
    with pytest.raises(ResizeRefused, match="the pipeline has no batchers"):
        resize.resized(_config(bps={}), resize.parse(["batch_processors", "spark", "3"]))
    for words, key in ((["processors", "3"], "processors.default.concurrency"),
                       (["batch_processors", "spark", "3"], "batchers.spark.concurrency")):
        with pytest.raises(ResizeRefused, match=f"^{key}: .*partition_by is set"):
            resize.resized(_config(partition=True), resize.parse(words))
    # a socket path that a fresh start would refuse is refused here too
    long_dir = "/tmp/" + "d" * 72   # fits batch_processor_spark_0.sock, not ..._999
    with pytest.raises(ResizeRefused, match=r"batchers\.spark\.concurrency 1000: "):
        resize.resized(_config(run_dir=long_dir),
                       resize.parse(["batch_processors", "spark", "1000"]))


def test_growing_processors_starts_them_and_the_batchers_subscribe():
    old = topo_mod.build(_config(2, {"a": 1, "b": 1}))
    new = topo_mod.build(_config(4, {"a": 1, "b": 1}))
    assert _ops(resize.plan(old, new)) == [
        ("adopt", (), ""),
        ("start", "processor_default_2", "ProcessorSupervisor"),
        ("start", "processor_default_3", "ProcessorSupervisor"),
        ("subscribe", "batcher_a", "processor_default_2"),
        ("subscribe", "batcher_b", "processor_default_2"),
        ("subscribe", "batcher_a", "processor_default_3"),
        ("subscribe", "batcher_b", "processor_default_3")]


def test_shrinking_drains_the_highest_first_then_removes_and_forgets():
    old = topo_mod.build(_config(4, {"spark": 3}))
    new = topo_mod.build(_config(2, {"spark": 1}))
    leaving = ("processor_default_3", "processor_default_2",
               "batch_processor_spark_2", "batch_processor_spark_1")
    assert _ops(resize.plan(old, new)) == [
        ("adopt", (), ""),
        *[("leave", s, "") for s in leaving],
        ("await_left", leaving, ""),
        ("remove", "processor_default_3", "ProcessorSupervisor"),
        ("remove", "processor_default_2", "ProcessorSupervisor"),
        ("remove", "batch_processor_spark_2", "BatchProcessorSupervisor_spark"),
        ("remove", "batch_processor_spark_1", "BatchProcessorSupervisor_spark"),
        ("forget", leaving, "")]


def test_the_same_shape_plans_nothing_and_other_changes_are_refused():
    topo = topo_mod.build(_config())
    assert resize.plan(topo, topo_mod.build(_config())) == []
    other = _config()
    other = dataclasses.replace(other, producer=dataclasses.replace(other.producer,
                                                                    concurrency=3))
    with pytest.raises(ValueError, match="cannot change the producers"):
        resize.plan(topo, topo_mod.build(other))


@given(st.integers(1, 12), st.integers(1, 12), st.integers(1, 6), st.integers(1, 6))
def test_any_resize_ends_in_the_new_shape(p0, p1, b0, b1):
    """Playing the steps on sets of ids gives exactly the new topology's stages, every
    leaving stage is told to leave and awaited before it is removed, and a started stage
    is never one that runs already."""
    old = topo_mod.build(_config(p0, {"k": b0}))
    new = topo_mod.build(_config(p1, {"k": b1}))
    running = set(old.stages)
    told: set[str] = set()
    awaited: set[str] = set()
    subscribed: set[str] = set()
    for step in resize.plan(old, new):
        if step.op == "start":
            assert step.stage not in running
            running.add(step.stage)
        elif step.op == "leave":
            told.add(step.stage)
        elif step.op == "await_left":
            assert set(step.stages) == told
            awaited |= set(step.stages)
        elif step.op == "remove":
            assert step.stage in awaited and step.stage in running
            running.discard(step.stage)
        elif step.op == "subscribe":
            assert step.peer in running
            subscribed.add(step.peer)
    assert running == set(new.stages)
    assert subscribed == set(new.processors) - set(old.processors)
    assert resize.shape(new) == f"{p1} processors; batch processors: k {b1}"


def test_reload_concurrency_changes_are_resize_requests():
    old, new = _config(2, {"a": 1, "b": 2}), _config(3, {"a": 1, "b": 1})
    assert resize.requests(old, new) == [resize.Request("processors", "default", 3),
                                         resize.Request("batch_processors", "b", 1)]


def test_a_stage_that_left_exits_without_a_requeue_one_that_did_not_is_lost():
    old = topo_mod.build(_config(3, {"spark": 1}))
    r = Reactions(old)
    for sid in old.stages:
        r.started(sid)
    new = topo_mod.build(_config(1, {"spark": 1}))
    r.adopt(new)
    assert r.topology.processors == ["processor_default_0"]
    assert set(r.leaving) == {"processor_default_1", "processor_default_2"}
    # processor 2 left, then stopped: a planned stop, nothing requeued by a later restart
    r.left("processor_default_2")
    assert r.exited("processor_default_2", expected=True) == []
    assert r.restarting("ProducerSupervisor", ["producer_0"]) == []
    # processor 1 died before it had left: what it held is lost and requeued once
    r.exited("processor_default_1", expected=False, reason="killed")
    requeues = r.restarting("PipelineSupervisor", ["ProcessorSupervisor"])
    assert sorted(c.stage for c in requeues if isinstance(c.command, commands.Requeue)) == [
        "producer_0", "producer_1"]
    # a restarted producer is announced to the leaving stages too (they wait for its
    # answer to their cancel, which its new incarnation will not send)
    r.exited("producer_0", expected=False)
    assert [s.stage for s in r.started("producer_0")] == ["processor_default_0"]
    r.started("processor_default_2")
    assert [s.stage for s in r.started("producer_0")] == ["processor_default_0",
                                                          "processor_default_2"]
    r.forget(["processor_default_2", "processor_default_1"])
    assert not r.leaving and "processor_default_2" not in r.blamed
    assert [s.stage for s in r.started("producer_0")] == ["processor_default_0"]


def test_reload_takes_concurrency_live_unless_partitioned():
    from offbroadway.daemon.core import reload

    changes = reload.plan(_config(2, {"spark": 1}), _config(3, {"spark": 2})).changes
    assert changes == [("processors.default.concurrency", 2, 3),
                       ("batchers.spark.concurrency", 1, 2)]
    with pytest.raises(reload.ReloadRefused,
                       match=r"^processors.default.concurrency: processors.default."
                             r"partition_by is set.*\(running 2, config 3\); nothing was "
                             r"changed$"):
        reload.plan(_config(2, partition=True), _config(3, partition=True))
    old = _config()
    more_producers = dataclasses.replace(old, producer=dataclasses.replace(old.producer,
                                                                           concurrency=3))
    with pytest.raises(reload.ReloadRefused, match=r"^producer\.concurrency: the producers'"):
        reload.plan(old, more_producers)


def test_an_auto_window_widens_before_a_growth_and_narrows_after_a_shrink():
    def rabbit(processors: int):
        raw = {
            "pipeline": {"name": "t", "handler": "examples.orders:Orders"},
            "producer": {"source": "rabbitmq", "concurrency": 2,
                         "options": {"url": "amqp://127.0.0.1", "queue": "q"}},
            "processors": {"default": {"concurrency": processors, "max_demand": 100}},
            "runtime": {"dir": "/tmp/ob-run"},
        }
        return topo_mod.build(validate(raw).config)

    small, big = rabbit(2), rabbit(6)
    assert big.specs["producer_0"].source_options["auto_prefetch"] == 300   # 6 x 100 / 2
    grow = resize.plan(small, big)
    assert [(s.op, s.stage, s.count) for s in grow[:3]] == [
        ("adopt", "", 0), ("window", "producer_0", 300),
        ("window", "producer_1", 300)]
    assert grow[3].op == "start"
    shrink = resize.plan(big, small)
    assert [(s.op, s.stage, s.count) for s in shrink[-3:]] == [
        ("forget", "", 0), ("window", "producer_0", 100), ("window", "producer_1", 100)]
    # a source without a window (spool): no window step
    assert all(s.op != "window" for s in resize.plan(topo_mod.build(_config(2)),
                                                     topo_mod.build(_config(5))))


def test_suspects_do_not_wait_for_a_leaving_processor_that_crashed():
    """A processor killed by a poison message while it leaves does not come back (the
    restart builds the new shape): the producers release their suspects when the others
    are up, not never."""
    from offbroadway.stages.wire.commands import Blame, Suspect

    old = topo_mod.build(_config(2, {"spark": 1}))
    r = Reactions(old, max_crashes=3)
    for sid in old.stages:
        r.started(sid)
    r.adopt(topo_mod.build(_config(1, {"spark": 1})))
    record = Blame("handle_message", (Suspect(0, 7, "m7"),), 1)
    r.exited("processor_default_1", expected=False, reason="killed", record=record)
    r.exited("processor_default_0", expected=True)
    sends = r.restarting("PipelineSupervisor", ["ProcessorSupervisor"])
    assert any(isinstance(s.command, commands.Requeue) and s.command.quarantine
               for s in sends)
    assert r.poison.awaiting == {"processor_default_0"}
    released = [s.stage for s in r.started("processor_default_0")
                if isinstance(s.command, commands.ReleaseSuspects)]
    assert released == ["producer_0", "producer_1"]


def test_the_change_says_what_changed_and_only_that() -> None:
    """``scale processors 4`` once printed the whole shape before and after ("2
    processors; batch processors: spark 1 -> 4 processors; batch processors: spark 1"),
    which read as if the batch processors had gone from 1 to 4."""
    old = topo_mod.build(_config(2, {"spark": 1, "other": 2}))
    assert resize.change(old, topo_mod.build(_config(4, {"spark": 1, "other": 2}))) == \
        "2 -> 4 processors"
    assert resize.change(old, topo_mod.build(_config(2, {"spark": 3, "other": 2}))) == \
        "spark: 1 -> 3 batch processors"
    assert resize.change(old, topo_mod.build(_config(1, {"spark": 1, "other": 1}))) == \
        "2 -> 1 processors; other: 2 -> 1 batch processors"
