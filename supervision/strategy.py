"""Restart strategies as pure decisions: which children to stop and start, in what order.

Keeping this free of processes and clocks lets it be checked against a model of OTP's
rules with hypothesis; the supervisor only carries the plan out.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from .spec import Restart, Strategy


class ExitAction(str, enum.Enum):
    """What a supervisor does with a child that terminated on its own."""

    RESTART = "restart"  # apply the strategy (and count against intensity)
    KEEP = "keep"        # leave it terminated, keep its spec (transient, normal exit)
    DELETE = "delete"    # forget it (temporary children, as OTP)


def exit_action(restart: Restart, normal: bool) -> ExitAction:
    """OTP's ``do_restart``: permanent always restarts, transient only after an abnormal
    exit, temporary never (and its spec is dropped)."""
    if restart is Restart.TEMPORARY:
        return ExitAction.DELETE
    if restart is Restart.PERMANENT or not normal:
        return ExitAction.RESTART
    return ExitAction.KEEP


@dataclass(frozen=True)
class ChildView:
    """What the planner needs to know of a child."""

    id: str
    alive: bool
    restart: Restart = Restart.PERMANENT


@dataclass(frozen=True)
class RestartPlan:
    """Terminate ``terminate`` in that order (reverse start order), drop ``delete`` (the
    temporary ones among them), then start ``start`` in that order (start order)."""

    terminate: tuple[str, ...]
    delete: tuple[str, ...]
    start: tuple[str, ...]


def affected(strategy: Strategy, ids: Sequence[str], failed: str) -> list[str]:
    """The children a strategy restarts when ``failed`` terminates, in start order."""
    if failed not in ids:
        raise KeyError(failed)
    if strategy is Strategy.ONE_FOR_ONE:
        return [failed]
    if strategy is Strategy.ONE_FOR_ALL:
        return list(ids)
    if strategy is Strategy.REST_FOR_ONE:
        return list(ids[ids.index(failed):])
    raise ValueError(f"unknown strategy {strategy!r}")


def plan_restart(strategy: Strategy, children: Sequence[ChildView], failed: str) -> RestartPlan:
    """The plan for restarting after ``failed`` terminated (or an operator asked for it).

    As OTP: the affected siblings still alive are terminated newest first; temporary
    siblings are terminated but not restarted; every other affected child, including ones
    left terminated earlier (a transient that exited normally, a ``terminate_child``), is
    started again oldest first.  ``failed`` itself is terminated first if it is still
    alive (an operator's restart) and is always started again.
    """
    by_id = {c.id: c for c in children}
    hit = affected(strategy, [c.id for c in children], failed)
    terminate = tuple(cid for cid in reversed(hit) if by_id[cid].alive)
    delete = tuple(cid for cid in reversed(hit)
                   if cid != failed and by_id[cid].restart is Restart.TEMPORARY)
    start = tuple(cid for cid in hit if cid not in delete)
    return RestartPlan(terminate=terminate, delete=delete, start=start)
