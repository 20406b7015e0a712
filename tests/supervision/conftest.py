"""Fixtures for the supervision tests: real child processes, an event recorder, and
polling with deadlines on the event loop (never a bare sleep standing in for a condition).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest
from offbroadway.supervision import Restart, WorkerSpec
from offbroadway.supervision.linux import guardian

HERE = Path(__file__).resolve().parent
CHILD = HERE / "children" / "proc.py"
RUN_TREE = HERE / "run_tree.py"
T = TypeVar("T")


def worker(child_id: str, log: Path, mode: str = "ok", *, code: int = 0, beat: float = 0.0,
           hog: int = 0, term_delay: float = 0.0, **spec: Any) -> WorkerSpec:
    """A WorkerSpec running children/proc.py."""
    argv = [sys.executable, str(CHILD), child_id, str(log), "--mode", mode, "--code",
            str(code), "--beat", str(beat), "--hog", str(hog), "--term-delay", str(term_delay)]
    spec.setdefault("shutdown", 5.0)
    spec.setdefault("start_timeout", 20.0)
    spec.setdefault("restart", Restart.PERMANENT)
    return WorkerSpec(id=child_id, argv=argv, **spec)


def read_log(log: Path) -> list[tuple[str, str, int]]:
    """(action, child id, pid) lines the children wrote, in order."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        action, cid, pid = line.split()
        out.append((action, cid, int(pid)))
    return out


class Recorder:
    """``on_event`` that keeps every event, in order."""

    def __init__(self) -> None:
        self.events: list[object] = []

    def __call__(self, event: object) -> None:
        self.events.append(event)

    def of(self, kind: str, since: int = 0) -> list[Any]:
        return [e for e in self.events[since:] if type(e).__name__ == kind]

    def mark(self) -> int:
        return len(self.events)


async def eventually(predicate: Callable[[], T], timeout: float = 45.0,
                     interval: float = 0.01, message: str = "condition") -> T:
    """Poll ``predicate`` on the loop until truthy; fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        await asyncio.sleep(interval)


def run(coro: Awaitable[T], timeout: float = 120.0) -> T:
    """Run a scenario on a fresh loop, bounded so a hang fails instead of blocking CI."""
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


def gone(pid: int, created: float | None = None) -> bool:
    """Dead (or a zombie, or the pid now belongs to another process)."""
    try:
        proc = psutil.Process(pid)
        if created is not None and abs(proc.create_time() - created) > 0.01:
            return True
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "children.log"


@pytest.fixture(autouse=True)
def no_children_left():
    """Every test must leave no child process of its own behind (processes that were
    already there, such as another suite's session-wide Spark server, are not its own).
    The guardian of this process (started by its first spawn, living as long as it does)
    is started first, so that it counts as already there."""
    guardian.token()
    me = psutil.Process(os.getpid())
    before = {c.pid for c in me.children(recursive=True)}
    yield
    deadline = time.monotonic() + 10
    left = []
    while time.monotonic() < deadline:
        left = [c for c in me.children(recursive=True)
                if c.pid not in before and not gone(c.pid)]
        if not left:
            return
        time.sleep(0.05)
    for c in left:
        c.kill()
    raise AssertionError(f"children left behind: {[c.pid for c in left]}")
