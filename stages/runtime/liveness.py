"""Telling a long callback from a hung process: a heartbeat thread in every stage process.

The supervisor kills a stage that stays silent for ``heartbeat_timeout``; the stage loop
beats once per tick (:meth:`Stage._tick`).  A ``handle_message`` that calls a service for
30 s keeps the loop from ticking, and used to be killed as hung: a restart of every
processor, a poison strike against a healthy message, and the rest of its frame held up
behind it.  Broadway's users run jobs of tens of seconds, so that is not a crash.

This thread looks at the main thread's stack (``sys._current_frames``) a few times a
second, which costs the hot path nothing: no marker is written per message.  When the
innermost call made by :mod:`.callbacks` is user code (a callback running), the stage is
alive and the thread beats for it; when the main thread is anywhere else and has not
ticked, nobody beats and the supervisor's watchdog still ends a stage stuck in its own
loop.  A process that cannot run this thread at all (stopped, or stuck in C code that
holds the GIL) is hung, and stays silent too.

``message_timeout`` (``[processors.default] message_timeout``) bounds one callback call:
past it the thread interrupts the main thread with a signal whose handler raises
:class:`MessageTimeout` *inside that call* (a blocking system call returns with EINTR),
so the callback fails its own message (``handle_message``; ``prepare_messages``: its
frame) like any exception and the rest of the frame goes on.  The exception derives from
``BaseException`` so a handler's ``except Exception`` does not swallow it.  A call that
still has not returned :data:`GRACE` seconds after its deadline (it caught the exception,
or sits in C code that retries) is no longer beaten for: the watchdog ends it as before.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

from offbroadway.supervision import child

from . import callbacks
from .callbacks import MessageTimeout

log = logging.getLogger("offbroadway.liveness")

#: how often the thread looks (also the deadline's resolution)
INTERVAL = 0.25
#: a callback running this long is said once in the log (it is alive, and beaten for)
LONG_CALL = 10.0
#: after its deadline, a call that has not returned is beaten for this much longer
GRACE = 5.0
#: the signal that carries the deadline to the main thread (the supervision guard uses
#: SIGRTMIN+3; user code is unlikely to use a real-time signal)
DEADLINE_SIGNAL = int(signal.SIGRTMIN) + 4

#: the functions of :mod:`.callbacks` whose calls are user code
_CALLERS = frozenset(f.__code__ for f in (callbacks._process, callbacks.handle_batch,
                                          callbacks.handle_failed))
#: frames in our own stage code (the blame record's writes) are never a callback
_OURS = callbacks.__file__.rsplit("/", 1)[0]


def running_callback(frame: FrameType | None) -> FrameType | None:
    """The frame of the user callback the main thread is in (the callee of
    :mod:`.callbacks`), or None when it is not running one."""
    callee = None
    while frame is not None:
        back = frame.f_back
        if back is not None and back.f_code in _CALLERS:
            callee = frame
            break
        frame = back
    if callee is None or callee.f_code.co_filename.startswith(_OURS):
        return None
    return callee


class Liveness:
    """The heartbeat thread of one stage process (started by :mod:`.worker`)."""

    def __init__(self, stage_id: str, message_timeout: float | None = None) -> None:
        self.stage_id = stage_id
        self.message_timeout = message_timeout or None
        self._main = threading.main_thread()
        self._stop = threading.Event()
        #: the callback call being watched, and since when
        self._call: FrameType | None = None
        self._since = 0.0
        self._said = False
        #: the call the signal handler is to interrupt (None: none)
        self._target: FrameType | None = None
        self.interrupted = 0

    def start(self) -> None:
        """Install the deadline's signal handler (main thread) and start the thread."""
        if self.message_timeout is not None:
            signal.signal(DEADLINE_SIGNAL, self._on_deadline)
        threading.Thread(target=self._run, name="liveness", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    # -- the thread ----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(INTERVAL):
            self.look(time.monotonic())

    def look(self, now: float) -> None:
        """One look at the main thread: beat for a callback that is running, interrupt
        one past its deadline."""
        frame = sys._current_frames().get(self._main.ident or -1)
        call = running_callback(frame)
        del frame
        if call is not self._call:
            self._call, self._since, self._said, self._target = call, now, False, None
        if call is None:
            return                 # the loop beats for itself, or nobody does (hung)
        running = now - self._since
        deadline = self.message_timeout
        if deadline is not None and running >= deadline:
            if running >= deadline + GRACE:
                return             # it would not stop: let the watchdog end it
            self._target = call
            signal.pthread_kill(self._main.ident, DEADLINE_SIGNAL)
        elif running >= LONG_CALL and not self._said:
            self._said = True
            log.warning("%s: %s has been running for %.0fs; the stage is alive and is not "
                        "restarted for it%s", self.stage_id, call.f_code.co_qualname, running,
                        "" if deadline else " (processors.default.message_timeout bounds "
                        "one call)")
        child.heartbeat()

    # -- the main thread -----------------------------------------------------------------
    def _on_deadline(self, _signum: int, frame: Any) -> None:
        """Raise inside the call that ran past its deadline, if it is still running (the
        signal can come a moment after it returned: then nothing happens)."""
        target = self._target
        while frame is not None:
            if frame is target:
                self._target = None
                self.interrupted += 1
                raise MessageTimeout(f"ran past message_timeout {self.message_timeout:g}s")
            frame = frame.f_back
