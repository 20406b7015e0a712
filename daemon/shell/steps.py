"""The daemon's parts, started and stopped in the order their dependencies give (in the
spirit of Celery's bootsteps).

Each :class:`Step` names what it requires; :func:`order` starts a step after everything it
requires, and otherwise in the order the steps are declared, so the declaration reads as
the start.  :class:`Steps` stops them in the reverse order of their start, and only the
ones that started: a step whose start raised has nothing to undo, and the steps after it
never started.  A stop that raises does not keep the others from stopping; the first such
error is raised once every step has been stopped.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

Action = Callable[[], Awaitable[None] | None]


@dataclass(frozen=True)
class Step:
    """One part of the daemon: how it starts, how it stops, and what it needs running."""

    name: str
    start: Action | None = None
    stop: Action | None = None
    requires: tuple[str, ...] = ()


def order(steps: Iterable[Step]) -> list[Step]:
    """``steps`` in start order: each after what it requires, ties in declaration order.

    Raises ValueError on a name declared twice, a requirement no step provides, or a
    circle of requirements."""
    pending = list(steps)
    names = [s.name for s in pending]
    if len(set(names)) != len(names):
        raise ValueError(f"a step is declared twice: {names}")
    for s in pending:
        unknown = [r for r in s.requires if r not in names]
        if unknown:
            raise ValueError(f"step {s.name!r} requires {unknown}, which no step provides")
    placed: list[Step] = []
    done: set[str] = set()
    while pending:
        ready = next((s for s in pending if done.issuperset(s.requires)), None)
        if ready is None:
            raise ValueError(f"steps that require each other: {[s.name for s in pending]}")
        pending.remove(ready)
        placed.append(ready)
        done.add(ready.name)
    return placed


async def _call(action: Action | None) -> None:
    if action is not None:
        result = action()
        if inspect.isawaitable(result):
            await result


class Steps:
    """Start the steps in :func:`order`; stop the started ones in reverse."""

    def __init__(self, steps: Iterable[Step]) -> None:
        self.steps = order(steps)
        #: the steps whose start returned, in start order
        self.started: list[str] = []

    async def start(self) -> None:
        """Start every step in order; the first start that raises ends it (that step does
        not count as started, and the ones after it are not started)."""
        for step in self.steps:
            await _call(step.start)
            self.started.append(step.name)

    async def stop(self) -> None:
        """Stop the started steps, last started first."""
        by_name = {s.name: s for s in self.steps}
        first: BaseException | None = None
        while self.started:
            step = by_name[self.started.pop()]
            try:
                await _call(step.stop)
            except Exception as exc:     # the others still stop; the first error surfaces
                first = first or exc
        if first is not None:
            raise first
