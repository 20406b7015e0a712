"""Restart intensity: exceeded at a nested supervisor, the parent applies its strategy;
exceeded at the root, ``wait_failed`` completes (and a daemon exits non-zero)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from offbroadway.supervision import Restart, Strategy, Supervisor, SupervisorSpec

from .conftest import RUN_TREE, Recorder, eventually, gone, read_log, run, worker


def test_nested_gives_up_and_parent_restarts_it_rest_for_one(log):
    """root rest_for_one [w1, inner(one_for_all, max 0)[x, y], w2]: killing x makes inner
    give up; the root then stops w2, restarts inner (x, y) and w2; w1 keeps running."""

    async def scenario():
        rec = Recorder()
        inner = SupervisorSpec("inner", Strategy.ONE_FOR_ALL, max_restarts=0,
                               children=[worker("x", log), worker("y", log)])
        sup = Supervisor(SupervisorSpec("root", Strategy.REST_FOR_ONE, max_restarts=3,
                                        children=[worker("w1", log), inner,
                                                  worker("w2", log)]), rec)
        await sup.start()
        try:
            before = {i: sup.find(i).pid for i in ("w1", "x", "y", "w2")}
            lines = len(read_log(log))
            mark = rec.mark()
            os.kill(before["x"], signal.SIGKILL)
            await eventually(lambda: len(rec.of("ChildStarted", mark)) == 3
                             and sup.state == "running", message="the subtree restart")
            gave_up = rec.of("SupervisorGaveUp", mark)
            assert [g.supervisor_id for g in gave_up] == ["inner"]
            assert "x killed by SIGKILL" in gave_up[0].reason
            # inner stopped y itself when giving up; then the root stopped w2
            assert [(a, c) for a, c, _ in read_log(log)[lines:]] == [
                ("stop", "y"), ("stop", "w2"),
                ("start", "x"), ("start", "y"), ("start", "w2")]
            assert [e.child_id for e in rec.of("ChildStarted", mark)] == ["x", "y", "w2"]
            after = {i: sup.find(i).pid for i in before}
            assert after["w1"] == before["w1"]
            assert all(after[i] != before[i] and gone(before[i]) for i in ("x", "y", "w2"))
            snap = sup.snapshot()
            assert snap["state"] == "running"
            assert [(n["id"], n["restarts"], n["state"]) for n in snap["children"]] == [
                ("w1", 0, "running"), ("inner", 1, "running"), ("w2", 1, "running")]
        finally:
            await sup.stop()

    run(scenario())


def test_root_intensity_exceeded_completes_wait_failed(log):
    async def scenario():
        rec = Recorder()
        sup = Supervisor(SupervisorSpec("root", Strategy.ONE_FOR_ONE, max_restarts=1,
                                        max_seconds=60,
                                        children=[worker("a", log), worker("b", log)]), rec)
        await sup.start()
        try:
            failed = asyncio_task(sup.wait_failed())
            first = sup.find("a").pid
            os.kill(first, signal.SIGKILL)
            await eventually(lambda: sup.find("a").pid not in (None, first)
                             and sup.state == "running", message="first restart")
            assert not failed.done()
            b_pid = sup.find("b").pid
            os.kill(sup.find("a").pid, signal.SIGKILL)
            reason = await failed
            assert reason.startswith("root gave up: more than 1 restarts in 60s")
            assert "a killed by SIGKILL" in reason
            assert sup.state == "failed"
            assert gone(b_pid), "a supervisor that gives up terminates all its children"
            assert [g.supervisor_id for g in rec.of("SupervisorGaveUp")] == ["root"]
            assert all(n["pid"] is None for n in sup.snapshot()["children"])
        finally:
            await sup.stop()

    run(scenario())


def test_max_restarts_zero_escalates_first_crash_through_the_levels(log):
    """inner (max 0) gives up on the first crash; root (max 0) gives up on inner's."""

    async def scenario():
        rec = Recorder()
        inner = SupervisorSpec("inner", Strategy.ONE_FOR_ONE, max_restarts=0,
                               children=[worker("x", log)])
        sup = Supervisor(SupervisorSpec("root", Strategy.ONE_FOR_ONE, max_restarts=0,
                                        children=[worker("w", log), inner]), rec)
        await sup.start()
        try:
            os.kill(sup.find("x").pid, signal.SIGKILL)
            reason = await sup.wait_failed()
            assert "root gave up" in reason and "inner gave up" in reason
            assert "x killed by SIGKILL" in reason
            assert [g.supervisor_id for g in rec.of("SupervisorGaveUp")] == ["inner", "root"]
            assert rec.of("ChildStarted")[-1].restarts == 0  # nothing was restarted
        finally:
            await sup.stop()

    run(scenario())


def test_transient_nested_supervisor_that_gives_up_is_not_restarted(log):
    """OTP: a supervisor gives up with reason ``shutdown``, which a transient entry in its
    parent does not restart (and which costs the parent no intensity)."""

    async def scenario():
        inner = SupervisorSpec("inner", Strategy.ONE_FOR_ONE, max_restarts=0,
                               restart=Restart.TRANSIENT, children=[worker("x", log)])
        sup = Supervisor(SupervisorSpec("root", Strategy.ONE_FOR_ONE, max_restarts=0,
                                        children=[worker("w", log), inner]))
        await sup.start()
        try:
            w = sup.find("w").pid
            os.kill(sup.find("x").pid, signal.SIGKILL)
            await eventually(lambda: sup.find("inner").state == "terminated",
                             message="inner left terminated")
            assert sup.state == "running" and sup.find("w").pid == w
        finally:
            await sup.stop()

    run(scenario())


def test_daemon_process_exits_nonzero_when_root_gives_up(log):
    proc = subprocess.Popen([sys.executable, str(RUN_TREE), str(log), "--max-restarts", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pids = json.loads(proc.stdout.readline())["pids"]
        os.kill(pids["d"], signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 1, err
        assert "root gave up" in out and "d killed by SIGKILL" in out
        assert all(gone(p) for p in pids.values())
        assert "supervisor root gave up" in err  # the log line
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def asyncio_task(coro):
    import asyncio
    return asyncio.ensure_future(coro)
