"""The live page's timeline: which supervision events become lines (with their reasons),
which only push a fresh state, and how a waiting stream is woken."""

from __future__ import annotations

import threading
import time

from offbroadway.daemon.observe.timeline import Timeline
from offbroadway.supervision import ChildExited, ChildStarted, Restarting, SupervisorGaveUp


def test_crashes_restarts_and_give_ups_are_lines_ordered_stops_and_starts_only_push() -> None:
    t = Timeline(keep=3)
    t.supervision(ChildExited("ProcessorSupervisor", "processor_default_0", 41, "killed by "
                              "SIGKILL", expected=False, signal=9))
    t.supervision(ChildExited("ProcessorSupervisor", "processor_default_1", 42, "exit 0",
                              expected=True))
    t.supervision(SupervisorGaveUp("ProcessorSupervisor", "more than 0 restarts in 5s"))
    t.supervision(Restarting("PipelineSupervisor", ("ProcessorSupervisor",), "gave up"))
    v = t.version
    t.supervision(ChildStarted("ProcessorSupervisor", "processor_default_0", 43, 1))
    assert t.version == v + 1
    assert [(e["kind"], e["what"], e["reason"]) for e in t.events()] == [
        ("crash", "processor_default_0 (pid 41) exited", "killed by SIGKILL"),
        ("gave-up", "ProcessorSupervisor gave up", "more than 0 restarts in 5s"),
        ("restart", "PipelineSupervisor restarts ProcessorSupervisor", "gave up")]
    t.add("reload", "SIGHUP reload", "batchers.default.batch_size 100 -> 50")
    assert len(t.events()) == 3 and t.events()[-1]["kind"] == "reload"   # the last 3 kept


def test_a_waiting_stream_wakes_on_a_change_or_the_close_not_before() -> None:
    t = Timeline()
    seen = t.version
    started = time.monotonic()
    assert t.wait(seen, 0.2) == seen and time.monotonic() - started >= 0.2
    threading.Timer(0.05, t.add, ("operator", "offbroadway drain")).start()
    assert t.wait(seen, 10) == seen + 1
    threading.Timer(0.05, t.close).start()
    started = time.monotonic()
    t.wait(t.version, 10)
    assert t.closed and time.monotonic() - started < 5
