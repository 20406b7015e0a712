"""Child specifications: what a supervisor is told about each child, as OTP's child_spec.

Specs are plain data.  The topology of a whole system is one tree of these, built in one
place by whoever wires the system (the daemon), and supervisors only interpret them.
"""

from __future__ import annotations

import enum
import math
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import SpecError


class Restart(str, enum.Enum):
    """OTP restart types: when a terminated child is restarted."""

    PERMANENT = "permanent"   # always
    TRANSIENT = "transient"   # only after an abnormal exit (non-zero code or a signal)
    TEMPORARY = "temporary"   # never


class Strategy(str, enum.Enum):
    ONE_FOR_ONE = "one_for_one"
    ONE_FOR_ALL = "one_for_all"
    REST_FOR_ONE = "rest_for_one"


#: OTP shutdown: ``"brutal_kill"`` (SIGKILL at once), seconds to wait after SIGTERM before
#: SIGKILL, or ``"infinity"`` (wait forever; OTP's default for supervisors).
Shutdown = float | str
BRUTAL_KILL = "brutal_kill"
INFINITY = "infinity"

#: argv / env may be computed at each start (a fresh token per start, say).
Argv = Sequence[str] | Callable[[], Sequence[str]]
Env = Mapping[str, str] | Callable[[], Mapping[str, str]] | None


@dataclass(frozen=True)
class WorkerSpec:
    """An OS process.  It counts as started once it writes ``R`` on its notify pipe
    (see :mod:`offbroadway.supervision.child`), within ``start_timeout`` seconds.

    ``env`` is added to the supervisor's own environment.  ``heartbeat_timeout`` turns on
    the liveness watchdog: a child silent on its notify pipe for that long is killed and
    handled as a crash.  ``memory_limit`` is an RSS ceiling in bytes, checked with psutil.
    ``meta`` is opaque to supervision; the wiring layer uses it to find its own children.
    ``pdeathsig`` is the signal the kernel sends the child when the supervising process dies
    (``PR_SET_PDEATHSIG``, even after its SIGKILL): SIGKILL by default; a child that calls
    :func:`.child.guard_descendants` takes :data:`.child.GUARD_SIGNAL`, catches it and
    kills its own descendants before itself.
    """

    id: str
    argv: Argv
    env: Env = None
    cwd: str | None = None
    restart: Restart = Restart.PERMANENT
    shutdown: Shutdown = 5.0
    start_timeout: float = 30.0
    heartbeat_timeout: float | None = None
    memory_limit: int | None = None
    meta: Mapping[str, object] = field(default_factory=dict)
    pdeathsig: int = int(signal.SIGKILL)

    type = "worker"

    def __post_init__(self) -> None:
        """Refuse a spec OTP would refuse (``supervisor:check_childspecs``), and turn the
        documented strings (``restart="temporary"``) into the enums the supervisor compares,
        so a hand-written spec means what it says before any child starts."""
        where = f"worker spec {self.id!r}"
        _check_id(self.id, where)
        if not callable(self.argv):
            if isinstance(self.argv, (str, bytes)) or not isinstance(self.argv, Sequence) \
                    or not self.argv or not all(isinstance(a, str) for a in self.argv):
                raise SpecError(f"{where}: argv must be a non-empty list of strings or a "
                                f"callable returning one, not {self.argv!r}")
        if self.env is not None and not callable(self.env) and not isinstance(self.env, Mapping):
            raise SpecError(f"{where}: env must be a mapping, a callable or None, "
                            f"not {self.env!r}")
        if self.cwd is not None and not isinstance(self.cwd, str):
            raise SpecError(f"{where}: cwd must be a string or None, not {self.cwd!r}")
        _set(self, "restart", _enum(Restart, self.restart, where, "restart"))
        _set(self, "shutdown", _shutdown(self.shutdown, where))
        _positive(self.start_timeout, where, "start_timeout")
        if self.heartbeat_timeout is not None:
            _positive(self.heartbeat_timeout, where, "heartbeat_timeout")
        if self.memory_limit is not None and (
                not isinstance(self.memory_limit, int) or isinstance(self.memory_limit, bool)
                or self.memory_limit <= 0):
            raise SpecError(f"{where}: memory_limit must be a positive number of bytes or "
                            f"None, not {self.memory_limit!r}")
        _check_meta(self.meta, where)
        if not isinstance(self.pdeathsig, int) or isinstance(self.pdeathsig, bool) or \
                not 0 < self.pdeathsig <= int(signal.SIGRTMAX) or \
                self.pdeathsig in _NOT_FATAL:
            raise SpecError(f"{where}: pdeathsig must be a signal that ends the process, "
                            f"not {self.pdeathsig!r}")


@dataclass(frozen=True)
class SupervisorSpec:
    """A supervisor: an object inside the supervising process, not an OS process.

    The restart intensity defaults to OTP's (``intensity`` 1, ``period`` 5 s): a second
    crash within 5 s is not transient.  An application that wants more says so in its
    specs (a pipeline keeps Broadway's 3 in 5 s)."""

    id: str
    strategy: Strategy
    children: Sequence[ChildSpec]
    max_restarts: int = 1
    max_seconds: float = 5.0
    restart: Restart = Restart.PERMANENT
    shutdown: Shutdown = INFINITY
    meta: Mapping[str, object] = field(default_factory=dict)

    type = "supervisor"

    def __post_init__(self) -> None:
        """Refuse invalid flags and children (OTP's ``init/1`` returning a bad
        ``{SupFlags, ChildSpecs}`` fails the start before any child runs), and accept the
        documented strings for ``strategy``, ``restart`` and ``shutdown``."""
        where = f"supervisor spec {self.id!r}"
        _check_id(self.id, where)
        _set(self, "strategy", _enum(Strategy, self.strategy, where, "strategy"))
        _set(self, "restart", _enum(Restart, self.restart, where, "restart"))
        _set(self, "shutdown", _shutdown(self.shutdown, where))
        if not isinstance(self.max_restarts, int) or isinstance(self.max_restarts, bool) \
                or self.max_restarts < 0:
            raise SpecError(f"{where}: max_restarts (OTP's intensity) must be an integer "
                            f">= 0, not {self.max_restarts!r}")
        _positive(self.max_seconds, where, "max_seconds (OTP's period)")
        if isinstance(self.children, (str, bytes, Mapping)) or \
                not isinstance(self.children, Sequence):
            raise SpecError(f"{where}: children must be a list of WorkerSpec / "
                            f"SupervisorSpec, not {self.children!r}")
        seen: set[str] = set()
        for child in self.children:
            if not isinstance(child, (WorkerSpec, SupervisorSpec)):
                raise SpecError(f"{where}: {child!r} is not a WorkerSpec or SupervisorSpec")
            if child.id in seen:
                raise SpecError(f"{where}: duplicate child id {child.id!r}")
            seen.add(child.id)
        _check_meta(self.meta, where)


ChildSpec = WorkerSpec | SupervisorSpec

#: signals whose default action does not end a process: useless as a PDEATHSIG
_NOT_FATAL = frozenset(int(s) for s in (
    signal.SIGCHLD, signal.SIGCONT, signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN,
    signal.SIGTTOU, signal.SIGURG, signal.SIGWINCH))


def _set(spec: object, name: str, value: object) -> None:
    object.__setattr__(spec, name, value)  # frozen: normalising in __post_init__ only


def _check_id(value: object, where: str) -> None:
    if not isinstance(value, str) or not value:
        raise SpecError(f"{where}: id must be a non-empty string")


def _check_meta(value: object, where: str) -> None:
    if not isinstance(value, Mapping):
        raise SpecError(f"{where}: meta must be a mapping, not {value!r}")


def _enum(cls: type[enum.Enum], value: Any, where: str, what: str) -> Any:
    """The member named by ``value`` (an enum member or its documented string)."""
    if isinstance(value, cls):
        return value
    try:
        return cls(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in cls)
        raise SpecError(f"{where}: {what} must be one of {allowed}, not {value!r}") from None


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def _positive(value: object, where: str, what: str) -> None:
    if not _number(value) or value <= 0:  # type: ignore[operator]
        raise SpecError(f"{where}: {what} must be a number of seconds > 0, not {value!r}")


def _shutdown(value: object, where: str) -> Shutdown:
    """OTP's ``validShutdown``: ``brutal_kill``, ``infinity`` or a timeout >= 0 (0: SIGTERM
    and, at once, SIGKILL)."""
    if value in (BRUTAL_KILL, INFINITY) and isinstance(value, str):
        return value
    if _number(value) and value >= 0:  # type: ignore[operator]
        return float(value)  # type: ignore[arg-type]
    raise SpecError(f"{where}: shutdown must be {BRUTAL_KILL!r}, {INFINITY!r} or a number "
                    f"of seconds >= 0, not {value!r}")
