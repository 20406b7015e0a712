"""Restart intensity, OTP's brake on restart loops: pure, so it is tested without processes.

A supervisor allows at most ``max_restarts`` restarts within any ``max_seconds`` window.
The restart that would make it ``max_restarts + 1`` means the fault is not transient: the
supervisor gives up and lets its parent decide (escalation).  ``max_restarts = 0`` makes
the first crash escalate, which is how Broadway ties processors together.
"""

from __future__ import annotations

from collections import deque


class RestartIntensity:
    """OTP's ``add_restart``: record a restart, then keep those within the period.

    A restart at ``t`` still counts at ``now`` while ``t >= now - max_seconds`` (OTP's
    ``can_restart`` keeps ``Restart >= Threshold``).  OTP counts in whole seconds; we keep
    the monotonic clock's fractions, which only ever narrows the window by under a second.
    """

    def __init__(self, max_restarts: int, max_seconds: float) -> None:
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, not {max_restarts}")
        if max_seconds <= 0:
            raise ValueError(f"max_seconds must be > 0, not {max_seconds}")
        self.max_restarts = max_restarts
        self.max_seconds = max_seconds
        self._times: deque[float] = deque()

    def add(self, now: float) -> bool:
        """Record a restart at ``now`` (non-decreasing); False means: intensity exceeded."""
        if self._times and now < self._times[-1]:
            raise ValueError("restart times must not go backwards")
        threshold = now - self.max_seconds
        while self._times and self._times[0] < threshold:
            self._times.popleft()
        self._times.append(now)
        return len(self._times) <= self.max_restarts

    @property
    def recent(self) -> tuple[float, ...]:
        """Restart times still remembered (oldest first), for status and tests."""
        return tuple(self._times)

    def describe(self) -> str:
        return f"more than {self.max_restarts} restarts in {self.max_seconds:g}s"
