"""OTP supervision for OS processes: a general library; it knows nothing of stages.

Exports are loaded lazily (PEP 562): every supervised child imports
``offbroadway.supervision.child`` to report ready, and must not pay for asyncio and
psutil at start-up, since a restart is only as fast as the child's imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Supervisor": "supervisor", "ChildInfo": "supervisor",
    "ChildStarted": "events", "ChildExited": "events", "SupervisorGaveUp": "events",
    "Restarting": "events",
    "StartError": "errors", "SupervisionError": "errors", "SpecError": "errors",
    "WorkerSpec": "spec", "SupervisorSpec": "spec", "ChildSpec": "spec", "Restart": "spec",
    "Strategy": "spec", "Shutdown": "spec", "BRUTAL_KILL": "spec", "INFINITY": "spec",
    "RestartIntensity": "intensity", "ExitStatus": "process", "Worker": "worker",
    "SpecTree": "tree", "workers_under": "tree",
}

__all__ = [
    "BRUTAL_KILL", "INFINITY", "ChildExited", "ChildInfo", "ChildSpec", "ChildStarted",
    "ExitStatus", "Restart", "RestartIntensity", "Restarting", "Shutdown", "SpecError",
    "SpecTree", "StartError", "Strategy",
    "SupervisionError", "Supervisor", "SupervisorGaveUp", "SupervisorSpec", "Worker",
    "WorkerSpec", "workers_under",
]

if TYPE_CHECKING:
    from .errors import SpecError, StartError, SupervisionError
    from .events import ChildExited, ChildStarted, Restarting, SupervisorGaveUp
    from .intensity import RestartIntensity
    from .process import ExitStatus
    from .spec import (
        BRUTAL_KILL,
        INFINITY,
        ChildSpec,
        Restart,
        Shutdown,
        Strategy,
        SupervisorSpec,
        WorkerSpec,
    )
    from .supervisor import ChildInfo, Supervisor
    from .tree import SpecTree, workers_under
    from .worker import Worker


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
