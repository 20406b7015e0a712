"""The daemon's recent history for the live page: restarts, crashes, reloads, operator verbs.

``status`` shows the tree as it is now; an operator looking at a pipeline that hiccuped
wants to know what happened a minute ago and why (the journal has it, line by line, among
everything else).  :class:`Timeline` keeps the last :data:`KEEP` such events with their
reasons, fed on the daemon's loop from the supervision events and the reload, and read by
the page's HTTP threads.  It also tells those threads that something changed
(:meth:`Timeline.wait`), so a crash reaches an open page at once instead of at its next
tick.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from offbroadway.supervision import ChildExited, ChildStarted, Restarting, SupervisorGaveUp

#: events kept: enough for a crash loop's story, small enough to send every second
KEEP = 50


class Timeline:
    """A bounded, thread-safe list of what happened, newest last."""

    def __init__(self, keep: int = KEEP) -> None:
        self._events: deque[dict] = deque(maxlen=keep)
        self._changed = threading.Condition()
        #: bumped at every change (an event, or a state change worth a push)
        self.version = 0
        self.closed = False

    def add(self, kind: str, what: str, reason: str = "") -> None:
        """Record one event (``kind``: crash, restart, gave-up, reload, operator)."""
        with self._changed:
            self._events.append({"at": time.time(), "kind": kind, "what": what,
                                 "reason": reason})
            self._bump()

    def touch(self) -> None:
        """Nothing worth a line, but the tree changed (a child is up again): push it."""
        with self._changed:
            self._bump()

    def _bump(self) -> None:
        self.version += 1
        self._changed.notify_all()

    def supervision(self, event: object) -> None:
        """The supervision events the page shows; ordered stops and starts only push."""
        if isinstance(event, ChildExited):
            if event.expected:
                self.touch()
            else:
                self.add("crash", f"{event.child_id} (pid {event.pid}) exited", event.reason)
        elif isinstance(event, Restarting):
            self.add("restart", f"{event.supervisor_id} restarts {', '.join(event.children)}",
                     event.reason)
        elif isinstance(event, SupervisorGaveUp):
            self.add("gave-up", f"{event.supervisor_id} gave up", event.reason)
        elif isinstance(event, ChildStarted):
            self.touch()

    def events(self) -> list[dict]:
        with self._changed:
            return list(self._events)

    def wait(self, seen: int, timeout: float) -> int:
        """Block until the version passes ``seen`` (or ``timeout``, or :meth:`close`);
        returns the version now."""
        with self._changed:
            self._changed.wait_for(lambda: self.version != seen or self.closed, timeout)
            return self.version

    def close(self) -> None:
        """The daemon stops: wake every waiting stream so it can end."""
        with self._changed:
            self.closed = True
            self._changed.notify_all()
