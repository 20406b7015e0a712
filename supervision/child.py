"""The child's side of supervision: tell the supervisor "ready" and "alive".

A supervised worker inherits the write end of a pipe whose fd number is in
``OFFBROADWAY_NOTIFY_FD``.  One byte per event keeps the cost of a heartbeat at a single
``write(2)``; outside a supervisor (the variable unset) both calls do nothing, so the same
program runs by hand.
"""

from __future__ import annotations

import os
import secrets
import signal

NOTIFY_FD_ENV = "OFFBROADWAY_NOTIFY_FD"
SUPERVISOR_PID_ENV = "OFFBROADWAY_SUPERVISOR_PID"

#: The PDEATHSIG of a child that guards its descendants (``WorkerSpec.pdeathsig``): a
#: real-time signal nobody else sends, whose default action (before the handler is
#: installed) still ends the process.
GUARD_SIGNAL = int(signal.SIGRTMIN) + 3

#: set by :func:`guard_descendants` to a token of this process's own, inherited by what it
#: starts: how a daemonized descendant (orphaned to init, in a session of its own, so in
#: neither our process tree nor our group) is still found and killed
GUARD_ENV = "OFFBROADWAY_GUARD"

_fd: int | None = None
_looked = False
_token: bytes | None = None


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


def guard_descendants() -> None:
    """Take this process's own children (and theirs) along when the supervisor dies.

    PR_SET_PDEATHSIG reaches only the process the supervisor forked: what a user's handler
    starts (a subprocess, a JVM) would be orphaned to init when the daemon is SIGKILLed.
    Call this first thing in a child whose spec has ``pdeathsig=GUARD_SIGNAL``: the kernel
    sends that signal when the supervisor dies, and the handler SIGKILLs every descendant
    (found through /proc, so ones that left the process group are found while their parent
    lives), every process that still carries this process's :data:`GUARD_ENV` token (one
    that daemonized: orphaned to init, in a session of its own, found only so), and then
    the whole process group, this process included.  A no-op outside a supervisor.  Python
    runs the handler between bytecodes of the main thread, so a callback stuck in C code
    that retries EINTR delays it until the call returns.
    """
    global _token
    if _notify_fd() is None:
        return
    token = f"{os.getpid()}-{secrets.token_hex(8)}"
    os.environ[GUARD_ENV] = token      # before any child: every descendant inherits it
    _token = f"{GUARD_ENV}={token}".encode()
    signal.signal(GUARD_SIGNAL, _supervisor_died)
    expected = os.environ.get(SUPERVISOR_PID_ENV)
    if expected and os.getppid() != int(expected):
        _supervisor_died(GUARD_SIGNAL, None)   # it died before the handler was in place


def _has_children() -> bool:
    """Has this process any child?  One small read per thread where the kernel lists
    children (CONFIG_PROC_CHILDREN); True when it cannot tell, so the walk decides."""
    try:
        tids = os.listdir("/proc/self/task")
        for tid in tids:
            with open(f"/proc/self/task/{tid}/children", "rb") as f:
                if f.read().strip():
                    return True
    except OSError:
        return True
    return False


def stat_fields(pid: int | str) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` from the state on (field 3 of proc(5) is
    ``[0]``), or None if the process is gone.  ``pid (comm) state ppid …``: the command
    may hold spaces and parentheses, so the split starts after the last ')'."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2:].split()


def descendants(root: int) -> list[int]:
    """Every live descendant of ``root``, children first, from one pass over /proc."""
    if root == os.getpid() and not _has_children():
        return []   # the common case, at every stage's exit: no walk over /proc
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        fields = stat_fields(name)
        if fields is not None and len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(name))
    out: list[int] = []
    todo = [root]
    while todo:
        for kid in children.get(todo.pop(), ()):
            out.append(kid)
            todo.append(kid)
    return out


def _strays() -> list[int]:
    """The processes, other than this one, whose environment holds this process's guard
    token: what its descendants started and left (a double fork, ``setsid cmd &`` from a
    shell that exits), reparented to init, so no walk from here finds them.  Only this
    user's processes are read (another's environment is not readable anyway); one that
    cleared its environment is not found."""
    if _token is None:
        return []
    me, uid = os.getpid(), os.getuid()
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    out = []
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if env.startswith(_token + b"\0") or (b"\0" + _token + b"\0") in env:
            out.append(int(name))
    return out


def kill_descendants() -> int:
    """SIGKILL every descendant of this process, and what they left behind still carrying
    its guard token (:func:`_strays`); how many there were.

    A guarded child calls it on its way out too: the supervisor SIGKILLs the process group
    of a child that exited, but a descendant that left the group (``setsid``) would be
    orphaned to init once its parent is gone."""
    pids = descendants(os.getpid())
    pids += [pid for pid in _strays() if pid not in pids]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return len(pids)


def _supervisor_died(signum: int, frame: object) -> None:
    me = os.getpid()
    kill_descendants()
    try:
        if os.getpgid(0) == me:
            os.killpg(me, signal.SIGKILL)   # what forked meanwhile, and us
    except OSError:
        pass
    os.kill(me, signal.SIGKILL)
