"""What a supervision tree tells its owner: plain dataclasses handed to ``on_event``.

The owner (the daemon) reacts to exits and restarts of particular children, e.g. hand
in-flight work back when a consumer dies, so every event names the child and the
supervisor it belongs to.  Events of nested supervisors reach the root's ``on_event``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChildStarted:
    """A worker reported ready (first start or a restart; ``restarts`` counts the latter)."""

    supervisor_id: str
    child_id: str
    pid: int
    restarts: int = 0


@dataclass(frozen=True)
class ChildExited:
    """A worker process ended.

    ``expected`` is True when its supervisor stopped it on purpose (ordered stop,
    ``terminate_child``, or a sibling's restart under one_for_all / rest_for_one); False for
    a crash, a kill by the watchdog or the memory limit, or a failed start.
    """

    supervisor_id: str
    child_id: str
    pid: int
    reason: str
    expected: bool
    code: int | None = None
    signal: int | None = None


@dataclass(frozen=True)
class SupervisorGaveUp:
    """Restart intensity was exceeded: the supervisor terminated its children and gave up."""

    supervisor_id: str
    reason: str


@dataclass(frozen=True)
class Restarting:
    """A supervisor carried out the terminations of a restart plan (a crash, a child's
    give-up, an operator's restart, a retry) and is about to start ``children`` in that
    order.  Every process the plan stopped, and the one that failed, is gone by now, and
    none has started again: the one moment a whole cascade is known to be down."""

    supervisor_id: str
    children: tuple[str, ...]
    reason: str
