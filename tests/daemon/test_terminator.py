"""The terminator (the drain's state machine), without processes: who is told what, what it
waits for and in which order, a stage starting during the drain, a crash cascade's requeue
ending it, the deadline, and ``--until-idle``'s idle signal."""

from __future__ import annotations

from offbroadway.daemon.config.load import validate
from offbroadway.daemon.core import topology as topo_mod
from offbroadway.daemon.core.reactions import Reactions
from offbroadway.daemon.core.terminator import Phase, Terminator
from offbroadway.daemon.spark.wiring import wired
from offbroadway.stages.wire import commands


def _topology(batchers: int = 2) -> topo_mod.Topology:
    raw = {
        "pipeline": {"name": "t", "handler": "examples.orders:Orders"},
        "producer": {"source": "spool", "options": {"path": "var/spool"}, "concurrency": 2},
        "processors": {"default": {"concurrency": 3}},
        "batchers": {f"b{i}": {"batch_size": 10, "concurrency": 2} for i in range(batchers)},
        "runtime": {"dir": "/tmp/ob-run"},
    }
    return topo_mod.build(validate(raw).config)


def spark_topology(producers: int = 2) -> topo_mod.Topology:
    """A pipeline with its own Spark server (``spark`` first under the root) and one
    batcher, ``b0``, with its committer."""
    config = validate({
        "pipeline": {"name": "t", "handler": "examples.orders:Orders"},
        "producer": {"source": "spool", "options": {"path": "var/spool"},
                     "concurrency": producers},
        "batchers": {"b0": {"batch_size": 10}},
        "spark": {"output": "/tmp/ob-out"},
        "runtime": {"dir": "/tmp/ob-run"},
    }).config
    return wired(config)


def test_begin_tells_sources_to_shut_down_and_their_consumers_not_to_resubscribe() -> None:
    t = _topology()
    term = Terminator(t)
    sends = term.begin()
    assert [(s.stage, type(s.command)) for s in sends] == (
        [(p, commands.NoResubscribe) for p in t.processors]
        + [(p, commands.Shutdown) for p in t.producers])
    assert term.draining and term.phase is Phase.FINISHING and not term.ended
    assert term.drained == set(t.processors + t.producers)
    term.exited("processor_default_1")          # its successor starts undrained
    assert term.drained == set(t.processors + t.producers) - {"processor_default_1"}


def test_the_drain_waits_for_every_finisher_then_every_source() -> None:
    t = _topology()
    term = Terminator(t)
    term.begin()
    assert term.finishers == t.batch_processors
    # a source settling early does not end the drain: finishers first
    for p in t.producers:
        term.report_settled(p)
    for bp in t.batch_processors[:-1]:
        term.report_done(bp)
        assert term.phase is Phase.FINISHING
    term.report_done(t.processors[0])          # not a finisher here: changes nothing
    assert term.phase is Phase.FINISHING
    term.report_done(t.batch_processors[-1])
    assert term.phase is Phase.COMPLETE and term.ended

    term2 = Terminator(t)
    term2.begin()
    for bp in t.batch_processors:
        term2.report_done(bp)
    assert term2.phase is Phase.SETTLING
    term2.report_settled(t.producers[0])
    assert term2.phase is Phase.SETTLING
    term2.report_settled(t.producers[1])
    assert term2.phase is Phase.COMPLETE


def test_without_batchers_the_processors_finish() -> None:
    t = _topology(batchers=0)
    term = Terminator(t)
    assert term.finishers == t.processors
    term.begin()
    for s in t.processors + t.producers:
        (term.report_done if s in t.processors else term.report_settled)(s)
    assert term.phase is Phase.COMPLETE


def test_a_stage_starting_during_the_drain_is_brought_into_it() -> None:
    t = _topology()
    term = Terminator(t)
    assert term.hello("producer_0") == []          # not draining: nothing
    term.begin()
    assert [type(s.command) for s in term.hello("producer_1")] == [commands.Shutdown]
    assert [type(s.command) for s in term.hello("processor_default_2")] == \
        [commands.NoResubscribe]
    assert term.hello("batcher_b0") == []
    for bp in t.batch_processors:
        term.report_done(bp)
    for p in t.producers:
        term.report_settled(p)
    assert term.hello("producer_1") == []          # the drain is over


def test_a_crash_cascade_requeue_ends_the_drain_unfinished() -> None:
    """The reactions' single requeue during the drain is what the daemon tells the
    terminator; the drain stops waiting, and ``reset`` runs the pipeline again."""
    t = _topology()
    reactions, term = Reactions(t), Terminator(t)
    for sid in t.stages:
        reactions.started(sid)
    term.begin()
    term.report_done(t.batch_processors[0])
    sends = reactions.exited("processor_default_0", expected=False, reason="killed")
    for sid in reversed(reactions.tree.cascade("processor_default_0")):
        if sid != "processor_default_0":
            term.exited(sid)
            sends += reactions.exited(sid, expected=True)
    sends += reactions.restarting("PipelineSupervisor", ("ProcessorSupervisor",))
    assert [type(s.command) for s in sends] == [commands.Requeue] * len(t.producers)
    term.requeued()
    assert term.phase is Phase.REQUEUED and term.ended
    term.reset()
    assert term.phase is Phase.RUNNING and not term.done and not term.settled


def test_a_planned_stop_during_the_drain_requeues_nothing() -> None:
    t = _topology()
    reactions, term = Reactions(t), Terminator(t)
    for sid in t.stages:
        reactions.started(sid)
    term.begin()
    sends = []
    for sid in reversed(t.stages):
        sends += reactions.exited(sid, expected=True)
    assert sends == []
    assert term.phase is Phase.FINISHING


def test_the_deadline_says_who_was_missing() -> None:
    t = _topology()
    term = Terminator(t)
    assert term.expire() == []                      # not draining: nothing
    term.begin()
    term.report_done(t.batch_processors[0])
    term.report_settled("producer_0")
    lines = term.expire()
    assert len(lines) == 2
    assert str(sorted(t.batch_processors[1:])) in lines[0]
    assert "['producer_1']" in lines[1]
    assert term.phase is Phase.EXPIRED and term.ended
    assert term.expire() == []                      # said once


def test_until_idle_every_source_idle_and_a_downstream_exit_forgets_it() -> None:
    t = _topology()
    term = Terminator(t)
    assert not term.idle_report("producer_0", True)
    assert term.idle_report("producer_1", True)
    term.exited("batch_processor_b0_0")             # downstream: its messages come back
    assert not term.idle_report("producer_1", True)
    assert term.idle_report("producer_0", True)
    assert not term.idle_report("producer_0", False)


def test_a_source_that_exits_after_saying_idle_is_idle_no_more() -> None:
    """A producer says idle with lines in flight; SIGKILLed, those lines are back at its
    source (unsettled in the spool's record) and its successor reads them again.  Its
    idle report, and one still on its way from the dead incarnation, must not begin the
    drain: the successor would be told to drain at its hello and never read them."""
    t = _topology()
    term = Terminator(t)
    assert not term.idle_report("producer_0", True)
    term.exited("producer_0")
    assert not term.all_idle
    assert not term.idle_report("producer_1", True)
    assert not term.idle_report("producer_0", True)   # sent before it died: stale
    assert not term.all_idle
    term.hello("producer_0")                          # the successor speaks for it now
    assert not term.idle_report("producer_0", False)
    assert term.idle_report("producer_0", True)
    assert term.all_idle


def test_a_spark_server_restart_in_the_drain_ends_it_and_leaves_nothing_drained() -> None:
    """The Spark JVM dies during the drain: the pipeline's rest_for_one stops every stage
    after it, producers included, and restarts them.  No live producer is left to requeue
    (no Requeue is sent), yet their sources took back what was in flight: the reactions
    say the restart hands messages back, the drain ends REQUEUED, and ``reset`` names no
    stage still in drain mode (their successors start undrained: no second restart)."""
    t = spark_topology()
    reactions, term = Reactions(t), Terminator(t)
    for sid in t.stages:
        reactions.started(sid)
    term.begin()
    assert term.drained == set(t.producers) | set(t.processors)
    reactions.exited("spark", expected=False, reason="exited with code 1")
    term.exited("spark")
    for sid in reversed(t.stages):
        reactions.exited(sid, expected=True)
        term.exited(sid)
    later = tuple(c.id for c in t.root.children)
    assert reactions.hands_back(later)
    assert reactions.restarting("PipelineSupervisor", later) == []
    term.requeued()
    assert term.phase is Phase.REQUEUED
    assert term.reset() == set()

    # a processor crash instead: the producers live on, drained, and must be restarted
    term.begin()
    for sid in t.stages:
        reactions.started(sid)
    reactions.exited("processor_default_0", expected=False, reason="killed")
    term.exited("processor_default_0")
    assert reactions.hands_back(("ProcessorSupervisor",))
    term.requeued()
    assert term.reset() >= set(t.producers)


def test_a_resize_changes_whom_the_drain_tells_and_waits_for() -> None:
    def shape(processors: int, bps: int) -> topo_mod.Topology:
        raw = {
            "pipeline": {"name": "t", "handler": "examples.orders:Orders"},
            "producer": {"source": "spool", "options": {"path": "var/spool"}},
            "processors": {"default": {"concurrency": processors}},
            "batchers": {"b": {"batch_size": 10, "concurrency": bps}},
            "runtime": {"dir": "/tmp/ob-run"},
        }
        return topo_mod.build(validate(raw).config)

    term = Terminator(shape(3, 3))
    term.report_done("batch_processor_b_2")       # a stale record of a stage that goes
    term.adopt(shape(1, 2))
    assert term.finishers == ["batch_processor_b_0", "batch_processor_b_1"]
    assert not term.done
    term.adopt(shape(4, 3))
    sends = term.begin()
    assert [s.stage for s in sends if isinstance(s.command, commands.NoResubscribe)] == [
        f"processor_default_{i}" for i in range(4)]
    for bp in ("batch_processor_b_0", "batch_processor_b_1"):
        term.report_done(bp)
    assert term.phase is Phase.FINISHING      # batch_processor_b_2 (added again) is waited for
    term.report_done("batch_processor_b_2")
    term.report_settled("producer_0")
    assert term.phase is Phase.COMPLETE


def test_a_run_again_waits_for_the_reports_of_its_own_drain() -> None:
    """A requeued drain leaves its drained stages running until the run again restarts
    them, and they report ``Done`` and ``Settled`` of the drain that ended (a processor
    whose producer cancelled it, a producer whose requeue emptied its in-flight table).
    Counted, they ended the next drain at the moment it began, while the message a crash
    had requeued was still on its way: exit 1 with it unacked.  The next drain waits for
    reports sent in it."""
    t = _topology(batchers=0)
    term = Terminator(t)
    term.begin()
    term.requeued()
    term.reset()
    for s in t.processors:                         # the drain that ended, late
        term.report_done(s)
    for p in t.producers:
        term.report_settled(p)
    term.begin()
    assert term.phase is Phase.FINISHING and not term.done and not term.settled
    for s in t.processors:
        term.report_done(s)
    assert term.phase is Phase.SETTLING
    for p in t.producers:
        term.report_settled(p)
    assert term.phase is Phase.COMPLETE


def test_a_source_that_took_back_its_messages_in_a_drain_makes_it_requeued() -> None:
    """A lost broker connection while draining, or after the drain completed while its
    last acks were still on their way: the broker has those messages again, so the drain
    cannot end with every message acked (``--until-idle`` runs again).  Not draining, it
    changes nothing here."""
    t = _topology(batchers=1)
    term = Terminator(t)
    term.taken_back()
    assert term.phase is Phase.RUNNING
    term.begin()
    term.taken_back()
    assert term.phase is Phase.REQUEUED and term.ended
    term.reset()
    term.begin()
    for s in t.last:
        term.report_done(s)
    for p in t.producers:
        term.report_settled(p)
    assert term.phase is Phase.COMPLETE
    term.taken_back()
    assert term.phase is Phase.REQUEUED
