"""Learning that a child exited, on the event loop, without polling.

``pidfd_open`` (Linux 5.3+) gives a descriptor that turns readable when the process
exits; the loop's selector watches it like a socket.  Where pidfds are missing we fall
back to a SIGCHLD handler that checks the watched pids.  Either way the watcher only
*reports* the exit: the zombie stays until :mod:`.process` reaps it, so its pid (and its
process group id) cannot be reused while we still signal it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import weakref
from collections.abc import Callable
from typing import Protocol

#: Set to "sigchld" to force the fallback (tests use it to exercise both paths).
WATCH_ENV = "OFFBROADWAY_EXIT_WATCH"

Cancel = Callable[[], None]


class ExitWatcher(Protocol):
    def watch(self, pid: int, callback: Callable[[], None]) -> Cancel:
        """Call ``callback`` once, on the loop, after ``pid`` (our child) has exited."""


def _exited(pid: int) -> bool:
    """Has our child ``pid`` exited?  WNOWAIT leaves the zombie for the reaper."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True  # already reaped by someone: as gone as it gets
    return info is not None


class PidfdWatcher:
    """One pidfd per child, registered with the loop's selector."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def watch(self, pid: int, callback: Callable[[], None]) -> Cancel:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            # Cannot happen for an unreaped child of ours, but be safe: report at once.
            handle = self._loop.call_soon(callback)
            return handle.cancel
        done = False

        def fire() -> None:
            nonlocal done
            if not done:
                cancel()
                callback()

        def cancel() -> None:
            nonlocal done
            if not done:
                done = True
                self._loop.remove_reader(fd)
                os.close(fd)

        self._loop.add_reader(fd, fire)
        return cancel


class SigchldWatcher:
    """SIGCHLD handler on the loop; signals coalesce, so every watched pid is checked."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._watched: dict[int, Callable[[], None]] = {}
        loop.add_signal_handler(signal.SIGCHLD, self._check)

    def watch(self, pid: int, callback: Callable[[], None]) -> Cancel:
        self._watched[pid] = callback
        self._loop.call_soon(self._check)  # it may have exited before we registered

        def cancel() -> None:
            if self._watched.get(pid) is callback:
                del self._watched[pid]

        return cancel

    def _check(self) -> None:
        for pid, callback in list(self._watched.items()):
            if self._watched.get(pid) is callback and _exited(pid):
                del self._watched[pid]
                callback()


_watchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ExitWatcher] = (
    weakref.WeakKeyDictionary())


def pidfd_supported() -> bool:
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


def watcher_for(loop: asyncio.AbstractEventLoop) -> ExitWatcher:
    """The loop's watcher, created on first use (pidfd unless unsupported or overridden)."""
    watcher = _watchers.get(loop)
    if watcher is None:
        if os.environ.get(WATCH_ENV) != "sigchld" and pidfd_supported():
            watcher = PidfdWatcher(loop)
        else:
            watcher = SigchldWatcher(loop)
        _watchers[loop] = watcher
    return watcher
