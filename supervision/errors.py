"""Exceptions of the supervision library."""

from __future__ import annotations


class SupervisionError(Exception):
    """An operation a supervisor refuses, named as OTP names it (``not_found``, ``running``…)."""


class SpecError(SupervisionError, ValueError):
    """A child spec or supervisor flag OTP would refuse (``{error, {invalid_..., _}}``):
    raised when the spec is built, so nothing has started yet."""


class StartError(SupervisionError):
    """A child did not start; the supervisor stopped the children it had started (as OTP).

    ``child_id`` is the worker (or supervisor) that failed, at any depth; ``path`` runs from
    the supervisor that raised down to that child, so the log says where in the tree.
    """

    def __init__(self, child_id: str, reason: str, path: tuple[str, ...] = ()) -> None:
        self.child_id = child_id
        self.reason = reason
        self.path = path or (child_id,)
        super().__init__(f"{'/'.join(self.path)} failed to start: {reason}")

    def within(self, supervisor_id: str) -> StartError:
        """The same failure seen one level up (the path gains the supervisor's id)."""
        return StartError(self.child_id, self.reason, (supervisor_id, *self.path))
