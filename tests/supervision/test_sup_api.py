"""OTP's supervisor API, the operator restart, find and the status snapshot."""

from __future__ import annotations

import os
import signal

import pytest
from offbroadway.supervision import (
    ChildExited,
    Restart,
    StartError,
    Strategy,
    SupervisionError,
    Supervisor,
    SupervisorSpec,
)

from .conftest import Recorder, eventually, gone, read_log, run, worker

NODE_KEYS = {"id", "kind", "strategy", "pid", "state", "restarts", "children"}


def _tree(log, max_restarts=0):
    inner = SupervisorSpec("inner", Strategy.REST_FOR_ONE, max_restarts=max_restarts,
                           children=[worker("x", log), worker("y", log), worker("z", log)])
    return SupervisorSpec("root", Strategy.ONE_FOR_ONE, max_restarts=max_restarts,
                          children=[worker("a", log), inner])


def test_snapshot_and_find(log):
    async def scenario():
        sup = Supervisor(_tree(log))
        assert sup.snapshot()["state"] == "stopped"
        await sup.start()
        try:
            snap = sup.snapshot()

            def check(node):
                assert set(node) == NODE_KEYS
                if node["kind"] == "worker":
                    assert node["strategy"] is None and isinstance(node["pid"], int)
                    assert node["state"] == "running" and node["children"] == []
                else:
                    assert node["pid"] is None and node["state"] == "running"
                for c in node["children"]:
                    check(c)

            check(snap)
            assert snap["strategy"] == "one_for_one"
            assert snap["children"][1]["strategy"] == "rest_for_one"
            assert [c["id"] for c in snap["children"][1]["children"]] == ["x", "y", "z"]
            assert sup.find("z").pid == snap["children"][1]["children"][2]["pid"]
            assert sup.find("inner").kind == "supervisor" and sup.find("root") is sup
            assert sup.find("nope") is None
        finally:
            await sup.stop()

    run(scenario())


def test_operator_restart_applies_strategy_without_counting_intensity(log):
    """max_restarts 0 everywhere: a crash would escalate, an operator restart must not."""

    async def scenario():
        rec = Recorder()
        sup = Supervisor(_tree(log, max_restarts=0), rec)
        await sup.start()
        try:
            for _ in range(3):
                before = {i: sup.find(i).pid for i in ("a", "x", "y", "z")}
                lines = len(read_log(log))
                await sup.restart_subtree_or_child("y")
                assert [(a, c) for a, c, _ in read_log(log)[lines:]] == [
                    ("stop", "z"), ("stop", "y"), ("start", "y"), ("start", "z")]
                after = {i: sup.find(i).pid for i in before}
                assert after["a"] == before["a"] and after["x"] == before["x"]
                assert after["y"] != before["y"] and after["z"] != before["z"]
            # a whole subtree
            before = {i: sup.find(i).pid for i in ("a", "x", "y", "z")}
            await sup.restart_subtree_or_child("inner")
            assert sup.find("a").pid == before["a"]
            assert all(sup.find(i).pid != before[i] for i in "xyz")
            assert sup.find("inner").restarts == 1 and sup.find("y").restarts == 4
            assert not rec.of("SupervisorGaveUp") and sup.state == "running"
            with pytest.raises(SupervisionError, match="not_found"):
                await sup.restart_subtree_or_child("nope")
        finally:
            await sup.stop()

    run(scenario())


def test_which_count_terminate_restart_delete_start_child(log):
    async def scenario():
        sup = Supervisor(_tree(log, max_restarts=5))
        await sup.start()
        try:
            inner = sup.find("inner")
            assert [(c.id, c.type, c.state) for c in sup.which_children()] == [
                ("a", "worker", "running"), ("inner", "supervisor", "running")]
            assert inner.count_children() == {"specs": 3, "active": 3, "supervisors": 0,
                                              "workers": 3}
            y = inner.find("y").pid
            await inner.terminate_child("y")
            assert gone(y) and inner.find("y").state == "terminated"
            assert inner.count_children()["active"] == 2
            with pytest.raises(SupervisionError, match="running"):
                await inner.restart_child("x")
            with pytest.raises(SupervisionError, match="running"):
                await inner.delete_child("x")
            await inner.restart_child("y")
            assert inner.find("y").state == "running" and inner.find("y").pid != y
            await inner.terminate_child("y")
            await inner.delete_child("y")
            assert [c.id for c in inner.which_children()] == ["x", "z"]
            node = await inner.start_child(worker("w", log))
            assert node.pid and [c.id for c in inner.which_children()] == ["x", "z", "w"]
            with pytest.raises(SupervisionError, match="already_started"):
                await inner.start_child(worker("w", log))
            with pytest.raises(StartError, match="inner/bad failed to start"):
                await inner.start_child(worker("bad", log, "exit-before-ready", code=1))
            assert inner.find("bad") is None
            with pytest.raises(SupervisionError, match="not_found"):
                await inner.terminate_child("nope")
            # a temporary child is forgotten once terminated
            await inner.start_child(worker("t", log, restart=Restart.TEMPORARY))
            await inner.terminate_child("t")
            assert inner.find("t") is None
            # a stop later stops everything left, newest first
            lines = len(read_log(log))
        finally:
            await sup.stop()
        assert [c for a, c, _ in read_log(log)[lines:]] == ["w", "z", "x", "a"]

    run(scenario())


def test_events_of_nested_workers_reach_the_root_and_a_failing_handler_is_harmless(log):
    seen = []

    def on_event(event):
        seen.append(event)
        raise RuntimeError("handler bug")

    async def scenario():
        sup = Supervisor(_tree(log, max_restarts=5), on_event)
        await sup.start()
        try:
            z = sup.find("z").pid
            os.kill(z, signal.SIGKILL)
            await eventually(lambda: sup.find("z").restarts == 1 and sup.find("z").pid,
                             message="z restarted")
            crash = next(e for e in seen if isinstance(e, ChildExited) and e.pid == z)
            assert crash.supervisor_id == "inner" and crash.child_id == "z"
            assert not crash.expected and crash.signal == signal.SIGKILL
            assert "killed by SIGKILL" in crash.reason
        finally:
            await sup.stop()

    run(scenario())


def test_change_spec_grows_and_shrinks_a_running_tree_and_a_restart_keeps_the_new_shape(log):
    """OTP's code_change: new children are added (not started) and kept by a restart; gone
    ones stay until terminate_child + delete_child; nothing counts toward intensity."""

    def tree(ids, strategy=Strategy.ONE_FOR_ALL):
        inner = SupervisorSpec("inner", strategy, max_restarts=0,
                               children=[worker(i, log) for i in ids])
        return SupervisorSpec("root", Strategy.ONE_FOR_ONE, max_restarts=5,
                              children=[worker("a", log), inner])

    async def scenario():
        rec = Recorder()
        sup = Supervisor(tree(["x", "y"]), rec)
        await sup.start()
        try:
            inner = sup.find("inner")
            pids = {i: sup.find(i).pid for i in ("a", "x", "y")}
            # grow: z is added, not started; nobody else moves
            assert await sup.change_spec(tree(["x", "y", "z"])) == ["z"]
            assert [(c.id, c.state) for c in inner.which_children()] == [
                ("x", "running"), ("y", "running"), ("z", "stopped")]
            await inner.restart_child("z")
            assert inner.find("z").state == "running"
            assert {i: sup.find(i).pid for i in pids} == pids
            # shrink: y and z stay until terminated and deleted
            assert await sup.change_spec(tree(["x"])) == []
            assert [c.id for c in inner.which_children()] == ["x", "y", "z"]
            z = inner.find("z").pid
            for cid in ("z", "y"):
                await inner.terminate_child(cid)
                await inner.delete_child(cid)
            assert gone(z) and [c.id for c in inner.which_children()] == ["x"]
            assert not rec.of("ChildExited") or all(e.expected for e in rec.of("ChildExited"))
            assert (sup.restarts, inner.restarts, sup.find("x").restarts) == (0, 0, 0)
            assert sup.find("x").pid == pids["x"] and sup.find("a").pid == pids["a"]
            # a crash restarts inner from its new spec: x alone, then x and w
            await sup.change_spec(tree(["x", "w"]))
            assert inner.find("w").state == "stopped"
            os.kill(sup.find("x").pid, signal.SIGKILL)
            await eventually(lambda: inner.restarts == 1 and inner.state == "running"
                             and all(inner.find(i).state == "running" for i in ("x", "w")),
                             message="inner restarted with x and w")
            assert [c.id for c in inner.which_children()] == ["x", "w"]
            assert sup.find("y") is None and sup.find("a").pid == pids["a"]
            # a child cannot change kind live: refused before anything changes
            bad = SupervisorSpec("root", Strategy.ONE_FOR_ONE, max_restarts=5, children=[
                SupervisorSpec("a", Strategy.ONE_FOR_ONE, children=[]), tree(["x"]).children[1]])
            with pytest.raises(SupervisionError, match="cannot become"):
                await sup.change_spec(bad)
            assert [c.id for c in inner.which_children()] == ["x", "w"]
        finally:
            await sup.stop()

    run(scenario())
