"""permanent / transient / temporary, and start failures, as OTP."""

from __future__ import annotations

import os
import signal
import sys

import pytest
from offbroadway.supervision import (
    Restart,
    StartError,
    Strategy,
    Supervisor,
    SupervisorSpec,
    WorkerSpec,
)

from .conftest import Recorder, eventually, gone, read_log, run, worker


def _tree(log, *children, strategy=Strategy.ONE_FOR_ONE):
    return SupervisorSpec("root", strategy, list(children), max_restarts=1000)


def test_transient_exit_0_is_not_restarted_but_exit_1_is(log):
    async def scenario():
        rec = Recorder()
        sup = Supervisor(_tree(log, worker("keep", log),
                               worker("t0", log, "exit-after-ready", code=0,
                                      restart=Restart.TRANSIENT),
                               worker("t1", log, "exit-after-ready", code=1,
                                      restart=Restart.TRANSIENT)), rec)
        # t1 exits 1 right after every start: restarted each time until the test stops it
        await sup.start()
        try:
            await eventually(lambda: sup.find("t0").state == "terminated", message="t0 done")
            await eventually(lambda: sup.find("t1").restarts >= 2, message="t1 restarts")
            assert sup.find("t0").restarts == 0
            assert [e.child_id for e in rec.of("ChildStarted")].count("t0") == 1
            t0_exit = [e for e in rec.of("ChildExited") if e.child_id == "t0"]
            assert [(e.code, e.expected) for e in t0_exit] == [(0, False)]
            assert sup.find("t0").pid is None and sup.state in ("running", "restarting")
        finally:
            await sup.stop()

    run(scenario())


def test_permanent_exit_0_is_restarted(log):
    async def scenario():
        sup = Supervisor(_tree(log, worker("p", log, "exit-after-ready", code=0)))
        await sup.start()
        try:
            await eventually(lambda: sup.find("p").restarts >= 1, message="p restarted")
        finally:
            await sup.stop()

    run(scenario())


def test_temporary_is_never_restarted_and_is_forgotten(log):
    async def scenario():
        sup = Supervisor(_tree(log, worker("a", log), worker("tmp", log,
                                                              restart=Restart.TEMPORARY),
                               worker("b", log), strategy=Strategy.REST_FOR_ONE))
        await sup.start()
        try:
            pids = {n.id: n.pid for n in sup.children}
            os.kill(pids["tmp"], signal.SIGKILL)
            await eventually(lambda: sup.find("tmp") is None, message="tmp forgotten")
            assert [c.id for c in sup.which_children()] == ["a", "b"]
            assert {n.id: n.pid for n in sup.children} == {"a": pids["a"], "b": pids["b"]}
        finally:
            await sup.stop()

    run(scenario())


def test_temporary_sibling_is_stopped_not_restarted_by_one_for_all(log):
    async def scenario():
        sup = Supervisor(_tree(log, worker("a", log), worker("tmp", log,
                                                              restart=Restart.TEMPORARY),
                               worker("b", log), strategy=Strategy.ONE_FOR_ALL))
        await sup.start()
        try:
            tmp = sup.find("tmp").pid
            os.kill(sup.find("b").pid, signal.SIGKILL)
            await eventually(lambda: sup.find("tmp") is None and sup.state == "running"
                             and sup.find("b").restarts == 1, message="restart done")
            assert gone(tmp)
            assert [c.id for c in sup.which_children()] == ["a", "b"]
        finally:
            await sup.stop()

    run(scenario())


@pytest.mark.parametrize("mode, timeout, expect", [
    ("exit-before-ready", 60.0, "exited with code 3 before reporting ready"),
    ("never-ready", 3.0, "not ready within start_timeout 3s"),
])
def test_start_failure_fails_start_and_stops_started_children(mode, timeout, expect, log):
    async def scenario():
        inner = SupervisorSpec("inner", Strategy.ONE_FOR_ONE, [
            worker("b", log), worker("bad", log, mode, code=3, start_timeout=timeout)])
        rec = Recorder()
        sup = Supervisor(SupervisorSpec("root", Strategy.ONE_FOR_ONE,
                                        [worker("a", log), inner, worker("never", log)]), rec)
        with pytest.raises(StartError) as info:
            await sup.start()
        err = info.value
        assert err.child_id == "bad" and err.path == ("root", "inner", "bad")
        assert expect in str(err) and str(err).startswith("root/inner/bad failed to start")
        # started in order, then stopped in reverse; "never" was never started
        assert [(a, c) for a, c, _ in read_log(log)] == [
            ("start", "a"), ("start", "b"), ("start", "bad"), ("stop", "b"), ("stop", "a")]
        assert all(gone(pid) for _, _, pid in read_log(log))
        bad_exit = [e for e in rec.of("ChildExited") if e.child_id == "bad"]
        assert len(bad_exit) == 1 and not bad_exit[0].expected
        assert sup.state == "failed"
        await sup.stop()  # harmless after a failed start

    run(scenario())


@pytest.mark.parametrize("method", ["setpriv", "preexec"])
@pytest.mark.parametrize("program", ["/no/such/program", "no-such-program-in-path"])
def test_unexecutable_program_fails_start(program, method, monkeypatch):
    monkeypatch.setenv("OFFBROADWAY_PDEATHSIG", method)

    async def scenario():
        sup = Supervisor(SupervisorSpec("root", Strategy.ONE_FOR_ONE, [
            WorkerSpec("ghost", argv=[program])]))
        with pytest.raises(StartError, match="root/ghost failed to start: cannot execute"):
            await sup.start()

    run(scenario())


def test_restart_that_fails_to_start_counts_toward_intensity(log, tmp_path):
    """OTP's try_again: each failed restart attempt is a restart; they end in giving up."""
    flag = tmp_path / "broken"

    def argv():
        mode = "exit-before-ready" if flag.exists() else "ok"
        return worker("w", log, mode, code=2).argv

    async def scenario():
        sup = Supervisor(SupervisorSpec("root", Strategy.ONE_FOR_ONE, max_restarts=3,
                                        max_seconds=60,
                                        children=[WorkerSpec("w", argv=argv)]))
        await sup.start()
        try:
            flag.touch()
            os.kill(sup.find("w").pid, signal.SIGKILL)
            reason = await sup.wait_failed()
            assert "root/w failed to start" not in reason  # the child's id, not a path
            assert "w failed to start: exited with code 2 before reporting ready" in reason
            starts = [a for a, c, _ in read_log(log) if a == "start"]
            assert len(starts) == 1 + 3  # first start, then 3 failed restart attempts
        finally:
            await sup.stop()

    run(scenario())


def test_argv_and_env_are_evaluated_at_each_start(log):
    seen = []

    def env():
        seen.append(len(seen))
        return {"GEN": str(len(seen))}

    async def scenario():
        spec = WorkerSpec("e", argv=[sys.executable, "-c",
                                     "import os; os.write(int(os.environ['OFFBROADWAY_NOTIFY_FD'])"
                                     ", b'R'); import time; time.sleep(60)"],
                          env=env)
        sup = Supervisor(SupervisorSpec("root", Strategy.ONE_FOR_ONE, [spec]))
        await sup.start()
        try:
            os.kill(sup.find("e").pid, signal.SIGKILL)
            await eventually(lambda: sup.find("e").restarts == 1 and sup.find("e").pid,
                             message="restart")
            assert seen == [0, 1]
        finally:
            await sup.stop()

    run(scenario())
