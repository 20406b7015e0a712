"""Ordered stop: reverse start order, each child's shutdown honoured."""

from __future__ import annotations

import os
import signal
import time

from offbroadway.supervision import (
    BRUTAL_KILL,
    INFINITY,
    Strategy,
    Supervisor,
    SupervisorSpec,
    WorkerSpec,
)

from .conftest import Recorder, eventually, gone, read_log, run, worker


def test_stop_is_reverse_start_order_through_nested_supervisors(log):
    async def scenario():
        inner = SupervisorSpec("inner", Strategy.ONE_FOR_ALL, [worker("c", log),
                                                               worker("d", log)])
        rec = Recorder()
        sup = Supervisor(SupervisorSpec("root", Strategy.REST_FOR_ONE, [
            worker("a", log), worker("b", log), inner, worker("e", log)]), rec)
        await sup.start()
        await sup.stop()
        order = [(a, c) for a, c, _ in read_log(log)]
        assert order == [("start", c) for c in "abcde"] + [("stop", c) for c in "edcba"]
        exits = rec.of("ChildExited")
        assert [e.child_id for e in exits] == list("edcba")
        assert all(e.expected and e.code == 0 for e in exits)
        assert sup.state == "stopped"
        assert all(n["state"] == "stopped" for n in sup.snapshot()["children"])
        await sup.stop()  # idempotent

    run(scenario())


def test_child_ignoring_sigterm_is_killed_after_its_shutdown(log):
    async def scenario():
        rec = Recorder()
        sup = Supervisor(SupervisorSpec("root", Strategy.ONE_FOR_ONE, [
            worker("polite", log), worker("stubborn", log, "ignore-term", shutdown=0.5)]), rec)
        await sup.start()
        t0 = time.monotonic()
        await sup.stop()
        took = time.monotonic() - t0
        exits = {e.child_id: e for e in rec.of("ChildExited")}
        assert exits["stubborn"].signal == signal.SIGKILL and exits["stubborn"].expected
        assert exits["polite"].code == 0
        assert 0.5 <= took < 20.0
        assert [c for _, c, _ in read_log(log)][-1] == "polite"  # stopped after stubborn

    run(scenario())


def test_brutal_kill_does_not_send_sigterm(log):
    async def scenario():
        rec = Recorder()
        sup = Supervisor(SupervisorSpec("root", Strategy.ONE_FOR_ONE, [
            worker("b", log, shutdown=BRUTAL_KILL)]), rec)
        await sup.start()
        await sup.stop()
        assert [a for a, _, _ in read_log(log)] == ["start"]  # no SIGTERM handler ran
        assert rec.of("ChildExited")[0].signal == signal.SIGKILL

    run(scenario())


def test_infinity_waits_for_a_slow_child(log):
    async def scenario():
        rec = Recorder()
        sup = Supervisor(SupervisorSpec("root", Strategy.ONE_FOR_ONE, [
            worker("slow", log, term_delay=1.0, shutdown=INFINITY)]), rec)
        await sup.start()
        t0 = time.monotonic()
        await sup.stop()
        assert time.monotonic() - t0 >= 1.0
        assert rec.of("ChildExited")[0].code == 0  # not killed

    run(scenario())


def test_nested_supervisor_shutdown_bounds_its_subtree(log):
    """A nested supervisor with shutdown 0.5: its stubborn child (shutdown 30) is SIGKILLed
    when the subtree's 0.5 s are up, not after 30 s."""

    async def scenario():
        inner = SupervisorSpec("inner", Strategy.ONE_FOR_ONE, shutdown=0.5, children=[
            worker("stubborn", log, "ignore-term", shutdown=30)])
        sup = Supervisor(SupervisorSpec("root", Strategy.ONE_FOR_ONE, [inner]))
        await sup.start()
        pid = sup.find("stubborn").pid
        t0 = time.monotonic()
        await sup.stop()
        assert time.monotonic() - t0 < 20
        assert gone(pid)

    run(scenario())


def test_stop_during_a_restart_cancels_it_and_leaves_nothing(log, tmp_path):
    """A restart stuck waiting for a child's ready must not hold up the stop."""
    stuck = tmp_path / "stuck"

    def argv():
        return worker("w", log, "never-ready" if stuck.exists() else "ok").argv

    async def scenario():
        sup = Supervisor(SupervisorSpec("root", Strategy.ONE_FOR_ONE, [
            worker("a", log), WorkerSpec("w", argv=argv, start_timeout=60)]))
        await sup.start()
        stuck.touch()
        os.kill(sup.find("w").pid, signal.SIGKILL)
        await eventually(lambda: sup.find("w").state == "starting"
                         and len(read_log(log)) == 3, message="the stuck restart")
        hanging = sup.find("w").proc.pid
        t0 = time.monotonic()
        await sup.stop()
        assert time.monotonic() - t0 < 20
        assert gone(hanging) and sup.state == "stopped"
        assert [n["state"] for n in sup.snapshot()["children"]] == ["stopped", "stopped"]

    run(scenario())
