"""Child specifications: what a supervisor is told about each child, as OTP's child_spec.

Specs are plain data.  The topology of a whole system is one tree of these, built in one
place by whoever wires the system (the daemon), and supervisors only interpret them.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field


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

    type = "worker"


@dataclass(frozen=True)
class SupervisorSpec:
    """A supervisor: an object inside the supervising process, not an OS process."""

    id: str
    strategy: Strategy
    children: Sequence[ChildSpec]
    max_restarts: int = 3
    max_seconds: float = 5.0
    restart: Restart = Restart.PERMANENT
    shutdown: Shutdown = INFINITY
    meta: Mapping[str, object] = field(default_factory=dict)

    type = "supervisor"


ChildSpec = WorkerSpec | SupervisorSpec
