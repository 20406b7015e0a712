"""A worker child of a supervisor: one node of the tree across all its incarnations.

The node outlives its OS processes so that status can say how often it was restarted and
so the supervisor can tell a fresh exit from a stale one (each exit names the
:class:`~.process.OSProcess` it came from).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from .errors import StartError
from .events import ChildExited, ChildStarted
from .process import OSProcess, StartFailed
from .spec import WorkerSpec

log = logging.getLogger("offbroadway.supervision")


class Parent(Protocol):
    """What a worker needs of its supervisor: where to send its events and its exit.  A
    protocol rather than the :class:`~.supervisor.Supervisor` class, which builds workers:
    the worker does not need to know it, so the two modules do not import each other."""

    @property
    def id(self) -> str: ...

    def emit(self, event: object) -> None: ...

    def child_exited(self, node: Any, incarnation: object, normal: bool,
                     reason: str) -> None: ...


class Worker:
    """States: ``stopped`` (never started or stopped in order), ``starting``, ``running``
    (up and ready), ``stopping``, ``restarting`` (exited, its supervisor is restarting it),
    ``terminated`` (not running, spec kept: ``terminate_child`` or a transient's normal
    exit), ``failed`` (its last start failed)."""

    kind = "worker"

    def __init__(self, spec: WorkerSpec, parent: Parent) -> None:
        self.spec = spec
        self.parent = parent
        self.state = "stopped"
        self.restarts = 0
        self.proc: OSProcess | None = None
        self._started_once = False

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.alive else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive

    @property
    def incarnation(self) -> object:
        """Identifies the current process; an exit from any other is stale."""
        return self.proc

    async def start(self) -> None:
        """Start a new process and wait until it is ready; raise :class:`StartError`."""
        if self._started_once:
            self.restarts += 1
        self._started_once = True
        self.state = "starting"
        proc = self.proc = OSProcess(self.spec, self._on_exit)
        try:
            await proc.start()
        except StartFailed as exc:
            self.state = "failed"
            log.error("worker %s of %s failed to start: %s", self.id, self.parent.id, exc)
            raise StartError(self.id, str(exc)) from None
        except BaseException:
            self.state = "stopped"
            raise
        self.state = "running"
        log.info("worker %s (pid %s) of %s is ready%s", self.id, proc.pid, self.parent.id,
                 f" (restart {self.restarts})" if self.restarts else "")
        self.parent.emit(ChildStarted(self.parent.id, self.id, proc.pid or 0, self.restarts))

    async def stop(self, final_state: str = "stopped") -> None:
        """Terminate the current process per the spec's ``shutdown`` (nothing if gone)."""
        proc = self.proc
        if proc is not None and proc.alive:
            self.state = "stopping"
            await proc.terminate(self.spec.shutdown)
        self.state = final_state

    def kill_now(self) -> None:
        """SIGKILL without waiting (a supervisor's own ``brutal_kill``)."""
        if self.proc is not None and self.proc.alive:
            self.proc.expected = True
            self.proc.kill()

    def _on_exit(self, proc: OSProcess) -> None:
        status = proc.status
        assert status is not None
        expected = proc.expected
        self.parent.emit(ChildExited(self.parent.id, self.id, proc.pid or 0, status.describe(),
                                     expected, status.code, status.signal))
        if expected or not proc.ready or proc is not self.proc:
            # An ordered stop, or a failed start (start() reports that one).
            log.info("worker %s (pid %s) of %s %s", self.id, proc.pid, self.parent.id,
                     status.describe())
            return
        log.warning("worker %s (pid %s) of %s %s", self.id, proc.pid, self.parent.id,
                    status.describe())
        self.state = "restarting"
        self.parent.child_exited(self, proc, status.normal, f"{self.id} {status.describe()}")

    def snapshot(self) -> dict[str, Any]:
        return {"id": self.id, "kind": "worker", "strategy": None, "pid": self.pid,
                "state": self.state, "restarts": self.restarts, "children": []}

    def find(self, child_id: str) -> Worker | None:
        return self if child_id == self.id else None

    def walk(self, visit: Callable[[Worker], None]) -> None:
        visit(self)
