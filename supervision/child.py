"""The child's side of supervision: tell the supervisor "ready" and "alive".

A supervised worker inherits the write end of a pipe whose fd number is in
``OFFBROADWAY_NOTIFY_FD``.  One byte per event keeps the cost of a heartbeat at a single
``write(2)``; outside a supervisor (the variable unset) both calls do nothing, so the same
program runs by hand.
"""

from __future__ import annotations

import os

NOTIFY_FD_ENV = "OFFBROADWAY_NOTIFY_FD"
SUPERVISOR_PID_ENV = "OFFBROADWAY_SUPERVISOR_PID"

_fd: int | None = None
_looked = False


def _notify_fd() -> int | None:
    global _fd, _looked
    if not _looked:
        _looked = True
        value = os.environ.get(NOTIFY_FD_ENV)
        _fd = int(value) if value else None
    return _fd


def _send(byte: bytes) -> None:
    fd = _notify_fd()
    if fd is None:
        return
    try:
        os.write(fd, byte)
    except (BlockingIOError, BrokenPipeError, OSError):
        # A full pipe means the supervisor is behind on reading heartbeats: dropping one is
        # harmless.  A broken pipe means the supervisor is gone and PDEATHSIG is on its way.
        pass


def orphaned() -> bool:
    """Did the supervisor die before the kernel could tie us to it?

    The supervisor sets PR_SET_PDEATHSIG through ``setpriv`` (see :mod:`.spawn`); had it
    died in the instant before that, no signal would ever come.  Only the process the
    supervisor spawned leads its own process group, so a grandchild (a wrapper script's
    child) is never mistaken for an orphan.
    """
    expected = os.environ.get(SUPERVISOR_PID_ENV)
    if not expected or _notify_fd() is None:
        return False
    return os.getpgid(0) == os.getpid() and os.getppid() != int(expected)


def notify_ready() -> None:
    """The child is up: the supervisor starts the next sibling only after this.

    An orphan (see :func:`orphaned`) exits here instead of running unsupervised."""
    if orphaned():
        os._exit(70)
    _send(b"R")


def heartbeat() -> None:
    """The child's loop is alive; the supervisor's watchdog resets its timer."""
    _send(b"H")
