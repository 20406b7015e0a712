"""OTP's documented supervisor semantics, case by case, with real processes.

* specs written with the documented strings (``restart="temporary"``) mean what they say,
  and invalid specs or flags are refused with a clear error before any child starts;
* a restart loop (a child whose every start fails) leaves the supervisor answering between
  attempts, as OTP's ``try_again_restart`` does;
* a child's own children (what a user's handler starts) die with the supervising process,
  even after its SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from offbroadway.supervision import (
    BRUTAL_KILL,
    Restart,
    SpecError,
    Strategy,
    SupervisionError,
    Supervisor,
    SupervisorSpec,
    WorkerSpec,
)

from tests.conftest import wait_until

from .conftest import CHILD, HERE, Recorder, eventually, gone, read_log, run, worker


def starts(log, cid):
    return [pid for action, c, pid in read_log(log) if action == "start" and c == cid]


# -- specs --------------------------------------------------------------------------------
def test_documented_strings_become_the_enums_the_supervisor_compares(log):
    w = worker("t", log, restart="temporary", shutdown="brutal_kill")
    assert w.restart is Restart.TEMPORARY and w.shutdown == BRUTAL_KILL
    assert worker("n", log, shutdown=2).shutdown == 2.0
    s = SupervisorSpec("s", "rest_for_one", children=[w], restart="transient",
                       shutdown="infinity")
    assert s.strategy is Strategy.REST_FOR_ONE and s.restart is Restart.TRANSIENT


def test_string_specs_behave_as_otp_with_real_processes(log):
    """temporary: never restarted and forgotten; transient: kept after a normal exit;
    one_for_all (a string) restarts the permanent siblings."""
    async def scenario():
        sup = Supervisor(SupervisorSpec("root", "one_for_all", max_restarts=5, children=[
            worker("p", log),
            worker("tr", log, "exit-after-ready", code=0, restart="transient"),
            worker("tmp", log, "exit-after-ready", code=3, restart="temporary",
                   shutdown="brutal_kill")]), Recorder())
        await sup.start()
        try:
            await eventually(lambda: sup.find("tmp") is None, message="temporary forgotten")
            await eventually(lambda: sup.find("tr").state == "terminated",
                             message="transient kept, terminated")
            p = sup.find("p").pid
            assert starts(log, "p") == [p] and len(starts(log, "tr")) == 1
            os.kill(p, signal.SIGKILL)
            await eventually(lambda: sup.find("p").pid not in (None, p) and
                             sup.state == "running", message="p restarted")
            # one_for_all: the transient sibling was started again with it; the temporary
            # one is gone for good
            assert len(starts(log, "tr")) == 2 and len(starts(log, "tmp")) == 1
        finally:
            await sup.stop()

    run(scenario())


@pytest.mark.parametrize("build, message", [
    (lambda log: worker("w", log, restart="temporary "), "restart must be one of"),
    (lambda log: worker("w", log, restart="sometimes"), "restart must be one of"),
    (lambda log: worker("w", log, shutdown="soon"), "shutdown must be"),
    (lambda log: worker("w", log, shutdown=-1), "shutdown must be"),
    (lambda log: worker("w", log, shutdown=True), "shutdown must be"),
    (lambda log: worker("w", log, start_timeout=0), "start_timeout"),
    (lambda log: worker("w", log, heartbeat_timeout=-2), "heartbeat_timeout"),
    (lambda log: worker("w", log, memory_limit=0), "memory_limit"),
    (lambda log: worker("w", log, pdeathsig=int(signal.SIGCHLD)), "pdeathsig"),
    (lambda log: WorkerSpec("w", argv=sys.executable), "argv must be"),
    (lambda log: WorkerSpec("w", argv=[]), "argv must be"),
    (lambda log: WorkerSpec("", argv=["true"]), "id must be"),
    (lambda log: SupervisorSpec("s", "simple_one_for_one", children=[]), "strategy must be"),
    (lambda log: SupervisorSpec("s", "one_for_one", children=[], max_restarts=-1),
     "max_restarts"),
    (lambda log: SupervisorSpec("s", "one_for_one", children=[], max_restarts=2.5),
     "max_restarts"),
    (lambda log: SupervisorSpec("s", "one_for_one", children=[], max_seconds=0),
     "max_seconds"),
    (lambda log: SupervisorSpec("s", "one_for_one", children="ab"), "children must be"),
    (lambda log: SupervisorSpec("s", "one_for_one", children=[{"id": "a"}]),
     "is not a WorkerSpec"),
    (lambda log: SupervisorSpec("s", "one_for_one",
                                children=[worker("a", log), worker("a", log)]),
     "duplicate child id 'a'"),
])
def test_invalid_specs_and_flags_are_refused_before_any_child_starts(log, build, message):
    with pytest.raises(SpecError, match=message) as err:
        SupervisorSpec("root", Strategy.ONE_FOR_ONE, children=[worker("ok", log), build(log)])
    assert isinstance(err.value, ValueError)   # a ValueError to callers that expect one
    assert "\n" not in str(err.value)          # one clear line
    assert read_log(log) == []                  # nothing was started


def test_a_supervisor_refuses_what_is_not_a_supervisor_spec(log):
    with pytest.raises(SpecError, match="not a SupervisorSpec"):
        Supervisor(worker("a", log))  # type: ignore[arg-type]


# -- a restart loop does not make the supervisor deaf ------------------------------------
def test_the_api_answers_during_a_restart_loop_and_terminate_child_ends_it(log):
    """Each failed start of ``b`` takes 1 s (never ready, start_timeout 1): longer than
    max_seconds / max_restarts, so intensity is never exceeded and the loop would go on
    forever.  Between attempts the supervisor serves calls and other exits, as OTP does."""
    good = {"b": True}
    base = worker("b", log).argv

    def argv_b():
        return [*base[:5], "ok" if good["b"] else "never-ready", *base[6:]]

    assert base[4] == "--mode"

    async def scenario():
        sup = Supervisor(SupervisorSpec("root", Strategy.ONE_FOR_ONE, max_restarts=3,
                                        max_seconds=2.0, children=[
            worker("a", log), WorkerSpec("b", argv_b, start_timeout=1.0)]), Recorder())
        await sup.start()
        try:
            good["b"] = False
            os.kill(sup.find("b").pid, signal.SIGKILL)
            await eventually(lambda: len(starts(log, "b")) >= 3, timeout=30,
                             message="b failing to start again and again")
            # OTP: which_children shows the child as restarting (here: restarting between
            # attempts, starting during one); active does not count it
            row = {c.id: c for c in sup.which_children()}["b"]
            assert row.state in ("restarting", "starting")
            assert (row.pid is None) == (row.state == "restarting")
            assert sup.count_children()["active"] == 1
            t0 = time.monotonic()
            with pytest.raises(SupervisionError, match="restarting"):
                await asyncio.wait_for(sup.restart_child("b"), 5)
            with pytest.raises(SupervisionError, match="restarting"):
                await asyncio.wait_for(sup.delete_child("b"), 5)
            # another child's crash is handled between attempts
            a = sup.find("a").pid
            os.kill(a, signal.SIGKILL)
            await eventually(lambda: sup.find("a").pid not in (None, a), timeout=10,
                             message="a restarted during b's loop")
            assert sup.find("b").state in ("restarting", "starting")
            # terminate_child answers within an attempt and ends the loop
            await asyncio.wait_for(sup.terminate_child("b"), 5)
            assert time.monotonic() - t0 < 15
            assert sup.find("b").state == "terminated"
            await eventually(lambda: sup.state == "running", timeout=5,
                             message="the supervisor back to running")
            n = len(starts(log, "b"))
            await asyncio.sleep(2.5)   # > two attempts: no retry may come after the terminate
            assert len(starts(log, "b")) == n
            assert sup.restarts == 0 and sup.state == "running"   # never gave up
            good["b"] = True
            await asyncio.wait_for(sup.restart_child("b"), 10)
            assert sup.find("b").state == "running" and sup.find("b").pid
        finally:
            await sup.stop()

    run(scenario())


# -- grandchildren die with the supervising process ---------------------------------------
@pytest.mark.parametrize("mode", ["guard", "plain"])
def test_a_childs_own_children_die_with_the_supervisor_even_after_its_sigkill(tmp_path, mode):
    """The child's subprocesses (one in its group, one that left it with setsid) go when
    the supervising process is SIGKILLed: with ``pdeathsig=GUARD_SIGNAL`` and
    ``guard_descendants()`` the child kills them itself; ``plain`` (the default SIGKILL, a
    child that does nothing) leaves it to the supervising process's guardian
    (:mod:`offbroadway.supervision.linux.guardian`), which outlives it for that."""
    pidfile = tmp_path / "pids.json"
    proc = subprocess.Popen([sys.executable, str(HERE / "run_guarded.py"), str(pidfile), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            process_group=0)
    pids: dict[str, int] = {}
    try:
        assert proc.stdout.readline().strip() == "ready"
        pids = json.loads(pidfile.read_text())
        created = {k: psutil.Process(v).create_time() for k, v in pids.items()}
        proc.kill()
        proc.wait(timeout=10)
        wait_until(lambda: gone(pids["child"], created["child"]), timeout=20,
                   message="the child killed by its PDEATHSIG")
        wait_until(lambda: all(gone(pids[k], created[k]) for k in pids), timeout=20,
                   message="the child's own subprocesses gone with it")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


assert CHILD.exists()
