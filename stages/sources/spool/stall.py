"""The spool's writes that a full disk refused, held and retried with back-off.

The spool writes to disk to settle lines (the ack record, the dead letters) and to move a
finished file to ``done_dir``.  A full file system (``ENOSPC``, ``EDQUOT``) used to raise
out of ``ack`` and kill the producer, which restarted into the same full disk until its
supervisor gave up.  Nothing was lost (unrecorded lines are read again), but the pipeline
died of a condition that heals by itself.  Now such a write is held: it and every write
after it wait, in order, and are tried again with the sources' back-off; meanwhile the
source fetches nothing (the lines held stay unacknowledged, so a crash still loses
nothing), reports itself ``disk full`` (status, ``offbroadway_source_connected`` 0), and
logs one line when it stalls and one when it resumes.  Each write is whole or absent: a
record or dead-letter append cut short is truncated back (:mod:`.record`,
:mod:`.deadletter`), and a copy to another file system goes through a temporary name
(:func:`.files.move_aside`).
"""

from __future__ import annotations

import errno
import logging
import time
from collections import deque
from collections.abc import Callable

from ..base import Backoff, next_attempt

log = logging.getLogger("offbroadway.sources.spool")

#: the errors that mean "no room now", which freeing space heals
FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_full(exc: OSError) -> bool:
    return exc.errno in FULL


class Stall:
    """Writes refused by a full disk, kept in order and retried with back-off."""

    def __init__(self, backoff_min: float = 0.1, backoff_max: float = 5.0) -> None:
        self._pending: deque[tuple[str, Callable[[], None]]] = deque()
        self._backoff = Backoff(backoff_min, backoff_max)
        self._backoff_max = backoff_max
        self._until = 0.0
        self._since = 0.0
        self.error = ""          # the last refusal, for stats (empty while not stalled)
        self.episodes = 0

    def __bool__(self) -> bool:
        return bool(self._pending)

    def run(self, what: str, op: Callable[[], None]) -> None:
        """Run ``op`` now, or queue it behind the writes already held; a full disk queues
        it and starts the stall.  ``op`` must leave nothing behind when it raises, and be
        safe to run again from the start (the spool's settling only settles what is still
        outstanding)."""
        if self._pending:
            self._pending.append((what, op))
            return
        try:
            op()
        except OSError as exc:
            if not is_full(exc):
                raise
            self._pending.append((what, op))
            self._refused(what, exc, first=True)

    def retry(self) -> None:
        """Once the back-off is over, run the held writes in order, until one is refused
        again."""
        if not self._pending or time.monotonic() < self._until:
            return
        while self._pending:
            what, op = self._pending[0]
            try:
                op()
            except OSError as exc:
                if not is_full(exc):
                    raise
                self._refused(what, exc, first=False)
                return
            self._pending.popleft()
        log.warning("spool: disk space back after %.1fs; the held writes are done and "
                    "reading resumes", time.monotonic() - self._since)
        self._backoff.reset()
        self.error = ""

    def wait(self) -> float:
        """Seconds until the next retry (0 when nothing is held)."""
        if not self._pending:
            return 0.0
        return max(0.01, self._until - time.monotonic())

    def _refused(self, what: str, exc: OSError, *, first: bool) -> None:
        delay = self._backoff.failed()
        self._until = time.monotonic() + delay
        self.error = f"{exc.strerror or exc}: {what}"
        if first:
            self._since = time.monotonic()
            self.episodes += 1
            log.error("spool: cannot %s: %s; holding it and every write after it, fetching "
                      "nothing (the lines held stay unacknowledged); retrying %s, then with "
                      "back-off up to %gs", what, exc.strerror or exc, next_attempt(delay),
                      self._backoff_max)
