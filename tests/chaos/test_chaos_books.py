"""The chaos engine's pure parts, without processes: the books it keeps must be right, or
the chaos test proves nothing (a wrong restart model passes a broken daemon or fails a
good one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from offbroadway.supervision.tree import snapshot_find

from bench.chaos import (
    ChaosOptions,
    Kill,
    KillBudget,
    LoadWindow,
    charged_supervisor,
    classify_exits,
    config_text,
    eligible,
    expected_restarts,
    output_check,
    spec_tree,
    unseen_kills,
)

pytestmark = pytest.mark.chaos


@pytest.fixture
def root(short_tmp: Path):
    """The tree the daemon builds for the chaos config: local Spark, 2 of each stage."""
    config = short_tmp / "chaos.toml"
    config.write_text(config_text(ChaosOptions(source="spool"), short_tmp,
                                  {"path": str(short_tmp / "spool")}))
    return spec_tree(str(config))


def status_of(spec, states: dict[str, str] | None = None) -> dict:
    """A status tree shaped like the daemon's, every node running unless told."""
    states = states or {}

    def node(s) -> dict:
        sup = s.type == "supervisor"
        return {"id": s.id, "kind": s.type, "pid": None if sup else 1000,
                "state": states.get(s.id, "running"), "restarts": 0,
                "children": [node(c) for c in s.children] if sup else []}

    return {"pipeline": "chaos", "tree": node(spec)}


def test_crashes_are_charged_where_otp_counts_them(root) -> None:
    assert charged_supervisor(root, "producer_1")[0].id == "ProducerSupervisor"
    # max_restarts = 0 supervisors escalate: their parent counts the crash
    assert charged_supervisor(root, "processor_default_0")[0].id == "PipelineSupervisor"
    assert charged_supervisor(root, "processor_default_0")[1] == "ProcessorSupervisor"
    assert charged_supervisor(root, "batch_processor_spark_1")[0].id == \
        "BatcherSupervisor_spark"
    assert charged_supervisor(root, "batcher_spark")[0].id == "BatcherSupervisor_spark"
    assert charged_supervisor(root, "spark")[0].id == "PipelineSupervisor"


def test_expected_restarts_follow_the_strategies(root) -> None:
    assert expected_restarts(root, ["producer_0"]) == {"producer_0": 1}
    bp = expected_restarts(root, ["batch_processor_spark_0"])
    assert bp == {"BatchProcessorSupervisor_spark": 1, "batch_processor_spark_0": 1,
                  "batch_processor_spark_1": 1}
    batcher = expected_restarts(root, ["batcher_spark"])
    assert batcher == {**bp, "batcher_spark": 1}
    proc = expected_restarts(root, ["processor_default_1"])
    assert proc["processor_default_0"] == proc["processor_default_1"] == 1
    assert proc["batch_processor_spark_1"] == proc["BatchersSupervisor"] == 1
    assert "producer_0" not in proc and "spark" not in proc
    everything = expected_restarts(root, ["spark"])
    assert everything["producer_1"] == everything["spark"] == everything["batcher_spark"] == 1
    assert "PipelineSupervisor" not in everything
    # counts add up over kills
    assert expected_restarts(root, ["spark", "batcher_spark", "producer_0"])["producer_0"] == 2


def test_the_budget_keeps_a_restart_spare(root) -> None:
    sup = charged_supervisor(root, "producer_0")[0]
    budget = KillBudget(root)
    allowed = sup.max_restarts - 1
    for i in range(allowed):
        assert budget.allows("producer_0", 10.0 + i * 0.1)
        budget.record("producer_1" if i % 2 else "producer_0", 10.0 + i * 0.1)
    assert not budget.allows("producer_1", 10.5)
    assert budget.allows("processor_default_0", 10.5)        # another supervisor's books
    assert budget.allows("producer_0", 10.0 + sup.max_seconds + 2.5)   # the window passed


def test_only_kills_handled_at_once_and_in_full_are_eligible(root) -> None:
    assert set(eligible(status_of(root), root, ["producer", "processor", "batcher",
                                                "batch_processor", "spark"])) == \
        {"producer", "processor", "batcher", "batch_processor", "spark"}
    # a batcher restarting: its subtree and every cascade through it wait; producers don't
    busy = eligible(status_of(root, {"BatcherSupervisor_spark": "restarting",
                                     "batcher_spark": "starting"}), root,
                    ["producer", "processor", "batcher", "batch_processor", "spark"])
    assert set(busy) == {"producer"}
    # the root restarting: nothing
    assert not eligible(status_of(root, {"PipelineSupervisor": "restarting"}), root,
                        ["producer", "processor"])


def test_a_status_from_before_the_daemon_read_a_kill_is_not_believed(root) -> None:
    """SIGKILL is asynchronous: until the daemon reads the exit, status shows the killed
    worker running under its old pid with the old counters (the flake: final books read
    3 ms after the last kill, one restart short).  Such a status must not count."""
    kill = Kill(at=1.0, incarnation=1, child="batcher_spark", kind="batcher", pid=1000,
                signalled_pid=1000, inflight=0, buffered=0, progress=0.5)
    before = status_of(root)                       # every worker running as pid 1000
    assert all(n["state"] == "running" for n in before["tree"]["children"])
    assert unseen_kills(before, [kill]) == [kill]
    # read: the worker shows no pid while its supervisor restarts it, then its successor's
    exited = status_of(root, {"batcher_spark": "restarting"})
    for node in (exited, status_of(root)):
        batcher = snapshot_find(node["tree"], "batcher_spark")
        batcher["pid"] = None if node is exited else 2000
        assert unseen_kills(node, [kill]) == []


def test_exits_are_told_apart_by_level() -> None:
    lines = [json.dumps({"level": "warning", "logger": "offbroadway.supervision",
                         "msg": "worker producer_0 (pid 11) of ProducerSupervisor killed by "
                                "SIGKILL"}),
             json.dumps({"level": "info", "logger": "offbroadway.supervision",
                         "msg": "worker batcher_spark (pid 12) of BatcherSupervisor_spark "
                                "exited normally (code 0)"}),
             "not json", json.dumps({"level": "warning", "logger": "other", "msg": "x"})]
    assert classify_exits(lines) == {11: "counted", 12: "during-stop"}


def test_the_in_flight_bound_takes_each_producers_window_maximum() -> None:
    def status(**inflight: int) -> dict:
        return {"tree": {"id": "root", "state": "running", "children": [
            {"id": p, "state": "running", "children": [],
             "messages": {"inflight": n, "buffered": 1}} for p, n in inflight.items()]}}

    w = LoadWindow(seconds=3.0)
    w.add(0.0, status(producer_0=500, producer_1=300))
    w.add(1.0, status(producer_0=0, producer_1=310))     # producer_0 just restarted
    assert w.bound() == (810, 2)
    w.add(5.0, status(producer_0=20, producer_1=30))     # older samples left the window
    assert w.bound() == (50, 2)


def test_output_check_counts_missing_duplicates_and_strangers() -> None:
    out = output_check([0, 1, 1, 3, 3, 3, 7], 5)
    assert out["missing"] == 2 and out["missing_sample"] == [2, 4]
    assert out["duplicates"] == 3 and out["max_copies"] == 3
    assert out["unexpected"] == [7]
