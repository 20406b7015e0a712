"""SIGKILL of one child restarts exactly the children OTP would, in OTP's order."""

from __future__ import annotations

import os
import signal

import pytest
from offbroadway.supervision import Strategy, Supervisor, SupervisorSpec

from .conftest import Recorder, eventually, gone, read_log, run, worker

IDS = ["a", "b", "c", "d"]

# strategy → (stopped by the supervisor in this order, started again in this order)
EXPECTED = {
    Strategy.ONE_FOR_ONE: ([], ["b"]),
    Strategy.ONE_FOR_ALL: (["d", "c", "a"], ["a", "b", "c", "d"]),
    Strategy.REST_FOR_ONE: (["d", "c"], ["b", "c", "d"]),
}


@pytest.mark.parametrize("mechanics", ["pidfd+setpriv", "sigchld+preexec"])
@pytest.mark.parametrize("strategy", list(EXPECTED), ids=lambda s: s.value)
def test_sigkill_restarts_what_otp_restarts(strategy, mechanics, log, monkeypatch):
    """Both ways of noticing exits (pidfd, the SIGCHLD fallback) and of setting PDEATHSIG."""
    watch, spawn_method = mechanics.split("+")
    monkeypatch.setenv("OFFBROADWAY_EXIT_WATCH", watch)
    monkeypatch.setenv("OFFBROADWAY_PDEATHSIG", spawn_method)
    stopped, restarted = EXPECTED[strategy]

    async def scenario():
        rec = Recorder()
        sup = Supervisor(SupervisorSpec("root", strategy, [worker(i, log) for i in IDS]),
                         rec)
        await sup.start()
        try:
            assert [e.child_id for e in rec.of("ChildStarted")] == IDS
            before = {n.id: n.pid for n in sup.children}
            lines = len(read_log(log))
            mark = rec.mark()
            os.kill(before["b"], signal.SIGKILL)
            await eventually(lambda: len(rec.of("ChildStarted", mark)) == len(restarted)
                             and sup.state == "running", message="the restarts")
            after = {n.id: n.pid for n in sup.children}

            # the supervisor's view: who exited on purpose, who started, in what order
            exits = rec.of("ChildExited", mark)
            assert [(e.child_id, e.expected) for e in exits] == (
                [("b", False)] + [(c, True) for c in stopped])
            assert exits[0].signal == signal.SIGKILL
            assert [e.child_id for e in rec.of("ChildStarted", mark)] == restarted

            # the children's own view: SIGTERM order, then start order
            seen = read_log(log)[lines:]
            assert [(act, cid) for act, cid, _ in seen] == (
                [("stop", c) for c in stopped] + [("start", c) for c in restarted])

            # pids: exactly the restarted ones changed, and the old ones are gone
            for cid in IDS:
                if cid in restarted:
                    assert after[cid] != before[cid]
                    assert gone(before[cid])
                else:
                    assert after[cid] == before[cid]
                    assert not gone(after[cid])
            assert [n.state for n in sup.children] == ["running"] * 4
            restarts = {n["id"]: n["restarts"] for n in sup.snapshot()["children"]}
            assert restarts == {c: int(c in restarted) for c in IDS}
        finally:
            await sup.stop()

    run(scenario())


def test_crash_while_restarting_is_handled_after(log):
    """Two children die at once under one_for_one: both come back, one restart each."""

    async def scenario():
        rec = Recorder()
        # two restarts in a moment: more than OTP's default intensity (1 in 5 s)
        sup = Supervisor(SupervisorSpec("root", Strategy.ONE_FOR_ONE,
                                        [worker(i, log) for i in IDS], max_restarts=3), rec)
        await sup.start()
        try:
            before = {n.id: n.pid for n in sup.children}
            mark = rec.mark()
            os.kill(before["a"], signal.SIGKILL)
            os.kill(before["c"], signal.SIGKILL)
            await eventually(lambda: len(rec.of("ChildStarted", mark)) == 2
                             and sup.state == "running", message="both restarts")
            assert sorted(e.child_id for e in rec.of("ChildStarted", mark)) == ["a", "c"]
            assert sup.find("b").pid == before["b"] and sup.find("d").pid == before["d"]
        finally:
            await sup.stop()

    run(scenario())
