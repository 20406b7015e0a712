"""One incarnation of a worker: spawn, readiness, liveness, memory, exit, termination.

A restart is a new :class:`OSProcess`; the :class:`~.worker.Worker` node keeps the
history.  Everything here runs on the event loop with callbacks (pidfd readers, the notify
pipe's reader, ``call_later`` timers), so watching a hundred children costs nothing while
they behave.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from .linux import exitwatch
from .spawn import spawn
from .spec import BRUTAL_KILL, INFINITY, Shutdown, WorkerSpec

log = logging.getLogger("offbroadway.supervision")

#: Seconds between RSS checks of a child with a ``memory_limit`` (one /proc read each).
MEMORY_CHECK_INTERVAL = 1.0


@dataclass(frozen=True)
class ExitStatus:
    """How a process ended: its exit code or signal, and ``cause`` if we killed it for a
    fault (watchdog, memory limit, start timeout)."""

    code: int | None = None
    signal: int | None = None
    cause: str | None = None

    @classmethod
    def from_returncode(cls, returncode: int, cause: str | None = None) -> ExitStatus:
        if returncode < 0:
            return cls(signal=-returncode, cause=cause)
        return cls(code=returncode, cause=cause)

    @property
    def normal(self) -> bool:
        """OTP's ``normal`` exit: code 0, on its own.  Decides transient restarts."""
        return self.code == 0 and self.cause is None

    def describe(self) -> str:
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = str(self.signal)
            how = f"killed by {name}"
        elif self.code == 0:
            how = "exited normally (code 0)"
        else:
            how = f"exited with code {self.code}"
        return f"{how} ({self.cause})" if self.cause else how

    __str__ = describe


class StartFailed(Exception):
    """The process could not be executed, exited before ready, or missed start_timeout."""


class OSProcess:
    """A child process of ours, from spawn to reaping.

    ``on_exit(proc)`` is called once, on the loop, when the process has exited and been
    reaped, whatever the reason; ``proc.expected`` says whether we were terminating it.
    """

    def __init__(self, spec: WorkerSpec, on_exit: Callable[[OSProcess], None]) -> None:
        self.spec = spec
        self.id = spec.id
        self.pid: int | None = None
        self.ready = False
        self.expected = False
        self.status: ExitStatus | None = None
        self._on_exit = on_exit
        self._popen: subprocess.Popen | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rfd: int | None = None
        self._ready_fut: asyncio.Future[None] | None = None
        self._exited: asyncio.Future[ExitStatus] | None = None
        self._unwatch: exitwatch.Cancel | None = None
        self._cause: str | None = None
        self._last_beat = 0.0
        self._timers: list[asyncio.TimerHandle] = []
        self._psutil: psutil.Process | None = None
        self._terminating: asyncio.Task[ExitStatus] | None = None

    @property
    def alive(self) -> bool:
        return self.pid is not None and self.status is None

    # -- start ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Spawn and wait for ``R``; on any failure the process is gone when this raises."""
        loop = self._loop = asyncio.get_running_loop()
        self._ready_fut = loop.create_future()
        self._exited = loop.create_future()
        spec = self.spec
        try:
            argv = list(spec.argv() if callable(spec.argv) else spec.argv)
            env = dict(spec.env() if callable(spec.env) else (spec.env or {}))
        except Exception as exc:  # the wiring's callable failed: a failed start, not a bug here
            raise StartFailed(f"cannot build argv/env: {exc!r}") from exc
        rfd, wfd = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            self._popen = spawn(argv, env, spec.cwd, wfd, spec.pdeathsig)
        except (OSError, subprocess.SubprocessError) as exc:
            os.close(rfd)
            raise StartFailed(f"cannot execute {argv[:1]}: {exc}") from exc
        finally:
            os.close(wfd)
        self.pid = self._popen.pid
        self._rfd = rfd
        loop.add_reader(rfd, self._on_notify)
        self._unwatch = exitwatch.watcher_for(loop).watch(self.pid, self._on_exit_seen)
        try:
            await asyncio.wait_for(asyncio.shield(self._ready_fut), spec.start_timeout)
        except TimeoutError:
            self.kill(f"not ready within start_timeout {spec.start_timeout:g}s")
            await asyncio.shield(self._exited)
            raise StartFailed(f"not ready within start_timeout {spec.start_timeout:g}s "
                              f"(pid {self.pid}, killed)") from None
        except asyncio.CancelledError:
            self.expected = True
            self.kill("start cancelled")
            await asyncio.shield(self._exited)
            raise
        self._arm_watchdogs()

    def _on_notify(self) -> None:
        assert self._rfd is not None
        try:
            data = os.read(self._rfd, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # every writer closed it: the child (and its forks) are exiting
            self._close_notify()
            return
        self._last_beat = time.monotonic()
        if b"R" in data and not self.ready:
            self.ready = True
            if self._ready_fut is not None and not self._ready_fut.done():
                self._ready_fut.set_result(None)

    def _close_notify(self) -> None:
        if self._rfd is not None:
            assert self._loop is not None
            self._loop.remove_reader(self._rfd)
            os.close(self._rfd)
            self._rfd = None

    # -- liveness and memory ----------------------------------------------------------------
    def _arm_watchdogs(self) -> None:
        assert self._loop is not None
        self._last_beat = time.monotonic()
        if self.spec.heartbeat_timeout:
            self._timers.append(self._loop.call_later(self.spec.heartbeat_timeout,
                                                      self._check_heartbeat))
        if self.spec.memory_limit:
            try:
                self._psutil = psutil.Process(self.pid)
            except psutil.Error:
                return
            self._timers.append(self._loop.call_later(MEMORY_CHECK_INTERVAL,
                                                      self._check_memory))

    def _check_heartbeat(self) -> None:
        if not self.alive or self.expected:
            return
        assert self._loop is not None and self.spec.heartbeat_timeout
        timeout = self.spec.heartbeat_timeout
        silent = time.monotonic() - self._last_beat
        if silent >= timeout:
            log.error("worker %s (pid %s) silent for %.1fs (heartbeat_timeout %gs): killing",
                      self.id, self.pid, silent, timeout)
            self.kill(f"no heartbeat for {silent:.1f}s, heartbeat_timeout {timeout:g}s")
        else:
            self._timers.append(self._loop.call_later(timeout - silent, self._check_heartbeat))

    def _check_memory(self) -> None:
        if not self.alive or self.expected or self._psutil is None:
            return
        assert self._loop is not None and self.spec.memory_limit
        try:
            rss = self._psutil.memory_info().rss
        except psutil.Error:
            return
        limit = self.spec.memory_limit
        if rss > limit:
            log.error("worker %s (pid %s) RSS %.1f MiB is over its memory_limit %.1f MiB: "
                      "killing", self.id, self.pid, rss / 2**20, limit / 2**20)
            self.kill(f"RSS {rss / 2**20:.1f} MiB over memory_limit {limit / 2**20:.1f} MiB")
        else:
            self._timers.append(self._loop.call_later(MEMORY_CHECK_INTERVAL,
                                                      self._check_memory))

    # -- signals ----------------------------------------------------------------------------
    def kill(self, cause: str | None = None) -> None:
        """SIGKILL the child's whole process group; ``cause`` marks the exit as a fault."""
        if cause and self._cause is None and not self.expected:
            self._cause = cause
        self._signal_group(signal.SIGKILL)

    def _signal_group(self, sig: int) -> None:
        # Only while unreaped: the zombie holds the pid, so the group id cannot be reused.
        if self.alive and self.pid is not None:
            try:
                os.killpg(self.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _signal_leader(self, sig: int) -> None:
        if self.alive and self.pid is not None:
            try:
                os.kill(self.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    # -- exit -------------------------------------------------------------------------------
    def _on_exit_seen(self) -> None:
        """The child exited (still a zombie): clear its group, reap, report once."""
        if self.status is not None or self._popen is None:
            return
        self._signal_group(signal.SIGKILL)  # what it forked dies with it
        if self._rfd is not None:
            self._on_notify_drain()
        returncode = self._popen.poll()
        if returncode is None:  # cannot happen after an exit notice; do not block the loop
            returncode = self._popen.wait(timeout=1.0)
        self.status = ExitStatus.from_returncode(returncode, self._cause)
        self._close_notify()
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        if self._ready_fut is not None and not self._ready_fut.done():
            self._ready_fut.set_exception(
                StartFailed(f"{self.status.describe()} before reporting ready (pid {self.pid})"))
            self._ready_fut.exception()  # retrieved: start() may be gone (cancelled)
        if self._exited is not None and not self._exited.done():
            self._exited.set_result(self.status)
        self._on_exit(self)

    def _on_notify_drain(self) -> None:
        """Read what the child wrote before dying: an ``R`` just before exit still counts
        as the order of events, so a start is judged on all the child said."""
        while self._rfd is not None:
            before = self.ready
            try:
                data = os.read(self._rfd, 4096)
            except OSError:
                return
            if not data:
                return
            if b"R" in data and not before:
                self.ready = True
                if self._ready_fut is not None and not self._ready_fut.done():
                    self._ready_fut.set_result(None)

    async def wait(self) -> ExitStatus:
        assert self._exited is not None
        return await asyncio.shield(self._exited)

    # -- termination ------------------------------------------------------------------------
    async def terminate(self, shutdown: Shutdown) -> ExitStatus:
        """OTP's shutdown: ``brutal_kill`` → SIGKILL; seconds → SIGTERM, then SIGKILL after
        that long; ``infinity`` → SIGTERM and wait.

        Runs as its own task, so a caller being cancelled never leaves a child half-stopped,
        and a second call waits for the same termination.
        """
        if self.status is not None:
            return self.status
        if self._terminating is None:
            self.expected = True
            self._terminating = asyncio.ensure_future(self._terminate(shutdown))
        return await asyncio.shield(self._terminating)

    async def _terminate(self, shutdown: Shutdown) -> ExitStatus:
        assert self._exited is not None
        if shutdown == BRUTAL_KILL:
            self._signal_group(signal.SIGKILL)
            return await self.wait()
        # SIGTERM to the leader only: it stops what it started in its own order; the
        # group gets SIGKILL when the leader is gone (see _on_exit_seen).
        self._signal_leader(signal.SIGTERM)
        if shutdown == INFINITY:
            return await self.wait()
        try:
            return await asyncio.wait_for(asyncio.shield(self._exited), float(shutdown))
        except TimeoutError:
            log.warning("worker %s (pid %s) still running %gs after SIGTERM: SIGKILL",
                        self.id, self.pid, float(shutdown))
            self._signal_group(signal.SIGKILL)
            return await self.wait()
