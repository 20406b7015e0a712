"""Where the NATS I/O thread leaves messages for the producer thread, with a wake-up fd.

The producer's loop is a single-threaded poller that wants one fd readable "when messages
wait".  The client's socket is no such fd (it belongs to an asyncio loop in another thread
and is readable for heartbeats and acks too), so this mailbox owns an eventfd, created
once, that the I/O thread makes readable only when the producer's last ``take`` came back
short: a producer without demand is never woken in a loop (its poller is level-triggered),
and one that asked for more than there was is woken as soon as more arrives.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from typing import Any


class Mailbox:
    """A bounded-by-the-caller FIFO of items shared by two threads, plus the eventfd."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: deque[Any] = deque()
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._want = False     # the last take came back short: wake on the next put
        self._woken = False    # the eventfd holds an unconsumed wake-up

    def fileno(self) -> int:
        return self._efd

    def __len__(self) -> int:
        return len(self._items)

    # -- I/O thread ----------------------------------------------------------------------------
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

    def _consume(self) -> None:
        try:
            os.eventfd_read(self._efd)
        except OSError:
            pass
        self._woken = False
