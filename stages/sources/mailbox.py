"""Where a broker source's I/O thread leaves messages for the producer thread, with a
wake-up fd (the ``rabbitmq`` and ``nats`` sources).

The producer's loop is a single-threaded poller that wants one fd readable "when messages
wait".  A client's socket is no such fd (it belongs to the I/O thread, changes on every
reconnect, and is readable for heartbeats and acks too), so this mailbox owns an eventfd,
created once, that the I/O thread makes readable only when the producer's last ``take``
came back short: a producer without demand is never woken in a loop (its poller is
level-triggered), and one that asked for more than there was is woken as soon as more
arrives.

With a ``lease``, a wake-up the producer did not consume (it had no demand after all) is
withdrawn by :meth:`Mailbox.tend` after that many seconds and offered again after a pause
that doubles up to ``retry_max``: a producer that stays without demand costs a wake-up per
half second at most, and one whose demand comes back finds the fd readable again.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from typing import Any


class Mailbox:
    """A bounded-by-the-caller FIFO of items shared by two threads, plus the eventfd."""

    def __init__(self, lease: float | None = None, retry_max: float = 0.5) -> None:
        self._lock = threading.Lock()
        self._items: deque[Any] = deque()
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._want = False     # the last take came back short: wake on the next put
        self._woken = False    # the eventfd holds an unconsumed wake-up
        self._lease = lease
        self._retry_max = retry_max
        self._woken_at = 0.0
        self._retry = lease or 0.0
        self._rewake_at = 0.0

    def fileno(self) -> int:
        return self._efd

    def __len__(self) -> int:
        return len(self._items)

    @property
    def woken(self) -> bool:
        """A wake-up waits unconsumed (the I/O thread then tends it soon)."""
        return self._woken

    # -- I/O thread ----------------------------------------------------------------------------
    def put(self, item: Any) -> None:
        with self._lock:
            self._items.append(item)
            if self._want:
                self._signal()

    def put_many(self, items: list[Any]) -> None:
        if not items:
            return
        with self._lock:
            self._items.extend(items)
            if self._want:
                self._signal()

    def take_all(self) -> list[Any]:
        """Everything not handed out yet (to give back to the server on pause or close)."""
        with self._lock:
            out = list(self._items)
            self._items.clear()
            return out

    def tend(self, now: float) -> None:
        """With a lease: withdraw a wake-up the producer has not consumed in time, and
        offer it again once the (growing) pause is over and items still wait."""
        if self._lease is None:
            return
        with self._lock:
            if self._woken and now - self._woken_at > self._lease:
                self._consume()
                self._rewake_at = now + self._retry
                self._retry = min(self._retry * 2, self._retry_max)
            elif (not self._woken and self._want and self._items
                  and self._rewake_at and now >= self._rewake_at):
                self._rewake_at = 0.0
                self._signal()

    # -- producer thread -----------------------------------------------------------------------
    def take(self, n: int, *, want_more: bool = True) -> list[Any]:
        """Up to ``n`` items; a short answer (and ``want_more``) arms the wake-up.

        ``take(0)`` only consumes a pending wake-up, so a producer with no demand that was
        woken does not see the fd readable on every poll.
        """
        with self._lock:
            if self._woken:
                self._consume()
            items = self._items
            k = min(max(n, 0), len(items))
            out = [items.popleft() for _ in range(k)]
            self._want = want_more and k < n
            self._retry = self._lease or 0.0
            self._rewake_at = 0.0
            return out

    def disarm(self) -> None:
        """No wake-ups until the next short take (pause, drain)."""
        with self._lock:
            self._want = False
            if self._woken:
                self._consume()

    def close(self) -> None:
        with self._lock:
            fd, self._efd = self._efd, -1
        if fd >= 0:
            os.close(fd)

    # -- under _lock ---------------------------------------------------------------------------
    def _signal(self) -> None:
        if not self._woken and self._efd >= 0:
            os.eventfd_write(self._efd, 1)
            self._woken = True
            self._woken_at = time.monotonic()

    def _consume(self) -> None:
        try:
            os.eventfd_read(self._efd)
        except OSError:
            pass
        self._woken = False

