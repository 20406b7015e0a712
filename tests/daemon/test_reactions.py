"""The daemon's reactions to supervision events, without processes: exactly one requeue
per producer per crash cascade, none on a planned stop, the same cascade for an operator's
restart as for a crash, resubscribe only to stages that are up, poison blame carried once."""

from __future__ import annotations

from collections import Counter

import pytest
from offbroadway.daemon.config.load import validate
from offbroadway.daemon.core import topology as topo_mod
from offbroadway.daemon.core.reactions import Reactions
from offbroadway.stages.wire.commands import Blame, Resubscribe, Suspect
from offbroadway.supervision.strategy import affected

P, C, B = 2, 3, 2   # producers, processors, batchers (each with 2 batch processors)


def _topology(max_crashes: int = 3, batchers: int = B) -> topo_mod.Topology:
    raw = {
        "pipeline": {"name": "t", "handler": "examples.orders:Orders"},
        "producer": {"source": "spool", "options": {"path": "var/spool"}, "concurrency": P},
        "processors": {"default": {"concurrency": C, "max_crashes": max_crashes}},
        "batchers": {f"b{i}": {"batch_size": 10, "concurrency": 2} for i in range(batchers)},
        "runtime": {"dir": "/tmp/ob-run"},
    }
    return topo_mod.build(validate(raw).config)


def _up(r: Reactions) -> None:
    for sid in r.topology.stages:
        r.started(sid)


def _crash_cascade(r: Reactions, crashed: str, record: Blame | None = None,
                   operator: bool = False) -> list:
    """Play the events the supervision tree emits for a crash (or an operator restart) of
    ``crashed``: its exit, its cascade's exits in reverse start order, the ``Restarting``
    of the supervisor that carries the plan out, then the starts."""
    out = []
    members = [s for s in r.tree.cascade(crashed) if s in r.topology.stages]
    target = r.tree.restart_target(crashed)
    if operator:
        assert r.operator_restart(crashed) == target
        exits = list(reversed(members))
    else:
        out += r.exited(crashed, expected=False, reason="killed by SIGKILL", record=record)
        exits = [s for s in reversed(members) if s != crashed]
    for sid in exits:
        out += r.exited(sid, expected=True, reason="exited normally (code 0)")
    parent = r.tree.parent[target]
    plan = affected(parent.strategy, [c.id for c in parent.children], target)
    out += r.restarting(parent.id, tuple(plan), "a plan")
    for sid in members:
        out += r.started(sid)
    return out


def _names(cmds) -> Counter:
    return Counter((c.stage, c.command.NAME) for c in cmds)


def test_a_processor_crash_cascade_is_every_downstream_stage() -> None:
    t = _topology()
    r = Reactions(t)
    assert set(r.tree.cascade("processor_default_1")) == set(
        t.processors + t.batchers + t.batch_processors)
    assert r.tree.restart_target("processor_default_1") == "ProcessorSupervisor"
    # a batch processor: its one_for_all siblings only; a batcher: itself and its own
    assert set(r.tree.cascade("batch_processor_b0_1")) == {"batch_processor_b0_0",
                                                          "batch_processor_b0_1"}
    assert set(r.tree.cascade("batcher_b1")) == {"batcher_b1", "batch_processor_b1_0",
                                                "batch_processor_b1_1"}
    # a producer: itself only (one_for_one)
    assert r.tree.cascade("producer_1") == ["producer_1"]


@pytest.mark.parametrize("crashed", ["processor_default_0", "processor_default_2", "batcher_b0",
                                     "batch_processor_b1_0"])
def test_one_requeue_per_producer_per_crash_cascade(crashed: str) -> None:
    r = Reactions(_topology())
    _up(r)
    cmds = _crash_cascade(r, crashed)
    requeues = [c for c in cmds if c.command.NAME == "requeue"]
    assert _names(requeues) == Counter({(p, "requeue"): 1 for p in r.topology.producers})
    # sent once the last member exited, before any member started again
    first_start = next((i for i, c in enumerate(cmds) if c.command.NAME == "resubscribe"),
                       len(cmds))
    assert all(cmds.index(c) < first_start for c in requeues)


def test_exits_send_nothing_the_restart_sends_one_requeue() -> None:
    r = Reactions(_topology())
    _up(r)
    assert r.exited("processor_default_1", expected=False, reason="killed") == []
    for sid in reversed(r.tree.cascade("processor_default_1")):
        if sid != "processor_default_1":
            assert r.exited(sid, expected=True) == []
    cmds = r.restarting("PipelineSupervisor", ("ProcessorSupervisor", "BatchersSupervisor"))
    assert [(c.stage, c.command.NAME) for c in cmds] == \
        [(p, "requeue") for p in r.topology.producers]
    assert "processor_default_1" in cmds[0].command.reason
    # a retry of the same plan (a failed start) has lost nothing new: no second requeue
    assert r.restarting("PipelineSupervisor", ("ProcessorSupervisor",)) == []


def test_a_sibling_still_starting_when_its_neighbour_crashed_is_covered() -> None:
    """The race that left messages in flight forever with a requeue per exit: p0 crashes
    while p1 is still starting; p1 starts, takes messages, and is then stopped by the
    give-up.  The single requeue comes after p1's exit."""
    r = Reactions(_topology(batchers=0))
    r.started("producer_0")
    r.started("producer_1")
    r.started("processor_default_0")
    cmds = r.exited("processor_default_0", expected=False, reason="killed")
    cmds += r.started("processor_default_1") + r.started("processor_default_2")
    cmds += r.exited("processor_default_2", expected=True)
    cmds += r.exited("processor_default_1", expected=True)
    assert not [c for c in cmds if c.command.NAME == "requeue"]
    cmds = r.restarting("PipelineSupervisor", ("ProcessorSupervisor",))
    assert [c.command.NAME for c in cmds] == ["requeue"] * P


def test_a_planned_stop_sends_no_requeue() -> None:
    r = Reactions(_topology())
    _up(r)
    cmds = []
    for sid in reversed(r.topology.stages):       # a drain / stop: reverse start order
        cmds += r.exited(sid, expected=True, reason="exited normally (code 0)")
    assert cmds == []
    # terminate_child of one batcher: nothing either
    r2 = Reactions(_topology())
    _up(r2)
    assert r2.exited("batcher_b0", expected=True) == []


def test_an_operator_restart_and_a_crash_of_the_same_child_cause_the_same_cascade() -> None:
    for child in ("processor_default_0", "batcher_b1", "batch_processor_b0_1"):
        crash, op = Reactions(_topology(max_crashes=0)), Reactions(_topology(max_crashes=0))
        _up(crash)
        _up(op)
        target = Reactions(_topology()).operator_restart(child)
        assert set(op.tree.cascade(target)) == set(crash.tree.cascade(child))
        a = _crash_cascade(crash, child)
        b = _crash_cascade(op, child, operator=True)
        assert _names(a) == _names(b)
        def shape(cmds):   # the reason's wording names the exits in their order
            return [(c.stage, type(c.command), getattr(c.command, "quarantine", None),
                     getattr(c.command, "blame", None)) for c in cmds]
        assert shape(a) == shape(b)
    # the processor's operator restart goes through ProcessorSupervisor, so the batchers
    # restart too (as after its crash)
    assert Reactions(_topology()).operator_restart("processor_default_0") == \
        "ProcessorSupervisor"


def test_blame_and_hold_ride_on_the_single_requeue_and_release_follows_the_restarts() -> None:
    r = Reactions(_topology(max_crashes=3), max_crashes=3)
    _up(r)
    record = Blame("handle_message", (Suspect(1, 1234, "m-7"),), 1)
    cmds = _crash_cascade(r, "processor_default_2", record=record)
    requeues = {c.stage: c.command for c in cmds if c.command.NAME == "requeue"}
    assert set(requeues) == {"producer_0", "producer_1"}
    assert all(a.quarantine for a in requeues.values())
    assert requeues["producer_0"].blame is None
    assert requeues["producer_1"].blame == Blame(
        "handle_message", (Suspect(1, 1234, "m-7"),), 1, "processor_default_2",
        requeues["producer_1"].blame.how)
    # the producers know the limit from their spec (no longer with each requeue)
    assert r.topology.specs["producer_1"].max_crashes == 3
    assert [c.stage for c in cmds if c.command.NAME == "release_suspects"] == \
        ["producer_0", "producer_1"]
    assert max(i for i, c in enumerate(cmds) if c.command.NAME == "requeue") < \
        min(i for i, c in enumerate(cmds) if c.command.NAME == "release_suspects")
    # release only once the last processor is up again
    r2 = Reactions(_topology(max_crashes=3), max_crashes=3)
    _up(r2)
    r2.exited("processor_default_0", expected=False, reason="killed", record=record)
    for sid in r2.topology.processors[1:]:
        r2.exited(sid, expected=True)
    r2.restarting("PipelineSupervisor", ("ProcessorSupervisor",))
    for sid in r2.topology.processors[:-1]:
        assert not [c for c in r2.started(sid) if c.command.NAME == "release_suspects"]
    assert [c.stage for c in r2.started(r2.topology.processors[-1])
            if c.command.NAME == "release_suspects"] == \
        r2.topology.producers


def test_resubscribe_goes_only_to_stages_that_are_up() -> None:
    r = Reactions(_topology())
    _up(r)
    cmds = _crash_cascade(r, "processor_default_0")
    # the batchers were restarting when the processors came back: none told to resubscribe
    assert not [c for c in cmds if c.command.NAME == "resubscribe"]
    # a producer restarting alone is announced to every processor (all up)
    cmds = r.exited("producer_1", expected=False, reason="killed") + r.started("producer_1")
    assert _names(cmds) == Counter({(p, "resubscribe"): 1 for p in r.topology.processors})
    assert all(c.command == Resubscribe("producer_1") for c in cmds)


def test_a_producer_restart_requeues_nothing() -> None:
    r = Reactions(_topology())
    _up(r)
    cmds = r.exited("producer_0", expected=False, reason="killed")
    cmds += r.restarting("ProducerSupervisor", ("producer_0",))
    assert cmds == []


def test_a_crash_during_a_cascade_joins_its_single_requeue() -> None:
    r = Reactions(_topology())
    _up(r)
    cmds = r.exited("batch_processor_b0_0", expected=False, reason="killed")
    # before b0's plan runs, a processor dies: the root's plan stops everything downstream
    cmds += r.exited("processor_default_0", expected=False, reason="killed")
    for sid in reversed(r.tree.cascade("processor_default_0")):
        if sid not in ("processor_default_0", "batch_processor_b0_0"):
            cmds += r.exited(sid, expected=True)
    cmds += r.restarting("PipelineSupervisor", ("ProcessorSupervisor", "BatchersSupervisor"))
    cmds += r.restarting("BatcherSupervisor_b0", ("BatchProcessorSupervisor_b0",))
    assert _names(cmds) == Counter({(p, "requeue"): 1 for p in r.topology.producers})


def test_no_batchers_a_processor_alone_requeues_at_once() -> None:
    raw_topo = _topology(batchers=0)
    r = Reactions(raw_topo)
    _up(r)
    cmds = _crash_cascade(r, "processor_default_1")
    assert _names([c for c in cmds if c.command.NAME == "requeue"]) == Counter(
        {(p, "requeue"): 1 for p in raw_topo.producers})


def test_what_a_restart_hands_back_to_the_source() -> None:
    """``hands_back``: the question a drain under --until-idle asks at each restart (may
    it still end with every message acked?).  A downstream crash does (the live producers
    requeue); a producer's restart does (its source takes back what it had in flight),
    and so does a Spark server's, which restarts every producer; a restart that loses
    nothing downstream and restarts no producer does not."""
    from tests.daemon.test_terminator import spark_topology

    topo = spark_topology(producers=P)
    r = Reactions(topo)
    _up(r)
    # the Spark JVM dies: rest_for_one stops everything after it, producers included
    r.exited("spark", expected=False, reason="exited with code 1")
    for sid in reversed(topo.stages):
        r.exited(sid, expected=True)
    later = tuple(c.id for c in topo.root.children)
    assert r.hands_back(later)
    assert r.restarting("PipelineSupervisor", later) == []   # no live producer to tell
    _up(r)
    # a producer alone (one_for_one): its source takes back what it had in flight
    r.exited("producer_0", expected=False, reason="killed")
    assert r.hands_back(("producer_0",))
    r.restarting("ProducerSupervisor", ("producer_0",))
    r.started("producer_0")
    # a committer: its batcher and batch processors go too (downstream: lost)
    r.exited("committer_b0", expected=False, reason="killed")
    for sid in ("batch_processor_b0_0", "batcher_b0"):
        r.exited(sid, expected=True)
    assert r.hands_back(("committer_b0", "batcher_b0", "BatchProcessorSupervisor_b0"))
    r.restarting("BatcherSupervisor_b0", ("committer_b0",))
    _up(r)
    # nothing downstream lost since the last restart, no producer among the children:
    # nothing goes back to the source
    assert not r.hands_back(("committer_b0",))


def test_a_consumer_restarting_while_its_producer_restarts_is_told_at_its_start() -> None:
    """The one path for a producer's restart is the daemon's resubscribe: a processor
    starting when the producer died (its subscription may have reached the incarnation
    that died) is told when it is up; one restarted after the producer died subscribed to
    the new incarnation at its start, and is told nothing."""
    r = Reactions(_topology(batchers=0))
    _up(r)
    cmds = r.exited("processor_default_0", expected=False, reason="killed")
    for sid in ("processor_default_2", "processor_default_1"):
        cmds += r.exited(sid, expected=True)
    cmds += r.restarting("PipelineSupervisor", ("ProcessorSupervisor",))
    # the processors are starting; producer_1 dies and is back before they are up
    cmds += r.exited("producer_1", expected=False, reason="killed")
    cmds += r.started("producer_1")     # no processor up: nobody told yet
    assert not [c for c in cmds if c.command.NAME == "resubscribe"]
    for sid in r.topology.processors:
        cmds = r.started(sid)
        assert [(c.stage, c.command) for c in cmds] == [(sid, Resubscribe("producer_1"))]

    # producer_0 died before the processors' plan started them: nothing to tell
    cmds = r.exited("producer_0", expected=False, reason="killed")
    for sid in reversed(r.topology.processors):
        cmds += r.exited(sid, expected=True)
    cmds += r.restarting("PipelineSupervisor", ("ProcessorSupervisor",))
    cmds += r.started("producer_0")
    for sid in r.topology.processors:
        cmds += r.started(sid)
    assert not [c for c in cmds if c.command.NAME == "resubscribe"]


def _spark_topology() -> topo_mod.Topology:
    raw = {
        "pipeline": {"name": "t", "handler": "examples.orders:Orders"},
        "producer": {"source": "spool", "options": {"path": "var/spool"}, "concurrency": P},
        "processors": {"default": {"concurrency": C}},
        "batchers": {f"b{i}": {"batch_size": 10, "concurrency": 2} for i in range(B)},
        "runtime": {"dir": "/tmp/ob-run"},
    }
    return topo_mod.build(validate(raw).config, spark_settings={"commit_rows": 100})


def test_the_live_committers_hear_when_the_sources_take_back_what_was_in_flight() -> None:
    """A producer's death hands back what its source held while copies of some are still
    downstream (and acks of some died with it): no stage a committer talks to restarts,
    so the daemon tells the committers, before the producer starts again.  A requeue
    after a batch processor's crash tells them too; a cascade that restarts the
    committers themselves (they read their journal back) tells nobody."""
    t = _spark_topology()
    assert t.committers == ["committer_b0", "committer_b1"]
    r = Reactions(t)
    _up(r)
    cmds = r.exited("producer_1", expected=False, reason="killed by SIGKILL")
    cmds += r.restarting("ProducerSupervisor", ("producer_1",), "producer_1 killed")
    assert _names(cmds) == Counter({(c, "redelivery"): 1 for c in t.committers})
    assert "producer_1" in cmds[0].command.reason
    r.started("producer_1")
    cmds = _crash_cascade(r, "batch_processor_b1_0")
    names = [(c.stage, c.command.NAME) for c in cmds]
    assert names[:2 * P] == [(p, "requeue") for p in t.producers] + \
        [(c, "redelivery") for c in t.committers]
    cmds = _crash_cascade(r, "processor_default_0")
    assert not [c for c in cmds if c.command.NAME == "redelivery"]
