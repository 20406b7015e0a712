"""The liveness watchdog and the memory limit: both kill the child and let the strategy
restart it, and both say so in the log."""

from __future__ import annotations

import logging

from offbroadway.supervision import Strategy, Supervisor, SupervisorSpec

from .conftest import Recorder, eventually, gone, run, worker

LOGGER = "offbroadway.supervision"


def test_silent_child_is_killed_and_restarted_healthy_one_is_left_alone(log, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)

    async def scenario():
        rec = Recorder()
        sup = Supervisor(SupervisorSpec("root", Strategy.ONE_FOR_ONE, max_restarts=100, children=[
            worker("beating", log, beat=0.05, heartbeat_timeout=2.0),
            worker("silent", log, heartbeat_timeout=0.5)]), rec)
        await sup.start()
        try:
            beating = sup.find("beating").pid
            first = sup.find("silent").pid
            await eventually(lambda: sup.find("silent").restarts >= 2, message="2 restarts")
            assert gone(first)
            kills = [e for e in rec.of("ChildExited") if e.child_id == "silent"]
            assert kills[0].pid == first and not kills[0].expected
            assert "no heartbeat for" in kills[0].reason and "heartbeat_timeout 0.5s" in (
                kills[0].reason)
            assert sup.find("beating").pid == beating  # the beating child was never touched
            assert not [e for e in rec.of("ChildExited") if e.child_id == "beating"]
        finally:
            await sup.stop()
        lines = [r.getMessage() for r in caplog.records if "silent for" in r.getMessage()]
        assert lines and lines[0].startswith(f"worker silent (pid {first}) silent for")

    run(scenario())


def test_memory_limit_exceeded_restarts_the_child(log, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)

    async def scenario():
        rec = Recorder()
        sup = Supervisor(SupervisorSpec("root", Strategy.ONE_FOR_ONE, max_restarts=100, children=[
            worker("lean", log, memory_limit=200 * 2**20),
            worker("hog", log, "hog", hog=120, memory_limit=60 * 2**20)]), rec)
        await sup.start()
        try:
            lean = sup.find("lean").pid
            first = sup.find("hog").pid
            await eventually(lambda: sup.find("hog").restarts >= 1 and sup.find("hog").pid,
                             message="hog restarted")
            killed = next(e for e in rec.of("ChildExited") if e.child_id == "hog")
            assert killed.pid == first and killed.signal == 9 and not killed.expected
            assert "over memory_limit 60.0 MiB" in killed.reason
            assert sup.find("lean").pid == lean
        finally:
            await sup.stop()
        lines = [r.getMessage() for r in caplog.records if "memory_limit" in r.getMessage()]
        assert lines[0].startswith(f"worker hog (pid {first}) RSS ")
        assert "is over its memory_limit 60.0 MiB: killing" in lines[0]

    run(scenario())
