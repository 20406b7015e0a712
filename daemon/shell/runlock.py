"""One daemon per runtime dir, and a dir only its user can write to.

The dir is created 0700, and one that others could write to is refused
(:func:`prepare_private_dir`): the daemon's sockets live there.  Then an exclusive
``flock`` on ``<runtime.dir>/daemon.lock``.

Everything a daemon keeps in its runtime dir (``control.sock``, ``hub.sock``, the metrics
files, blame records) would be taken over or wiped by a second daemon started on the same
dir, leaving the first running but unreachable.  So the lock is the first thing taken,
before anything in the dir is touched, and a second daemon exits with one line naming
the pid that holds it.  The kernel drops the lock when the holder dies, however it dies,
so a stale lock file never blocks a restart.  The descriptor is close-on-exec: stage
processes do not hold the lock.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

LOCK_FILE = "daemon.lock"


class AlreadyRunning(RuntimeError):
    pass


class RuntimeDirError(RuntimeError):
    pass


def prepare_private_dir(path: str) -> None:
    """Create ``path`` 0700, or refuse one that others could write to (sockets live there)."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
    except OSError as exc:     # check says so first (checks.preflight); a race lands here
        raise RuntimeDirError(f"runtime dir {path}: {exc.strerror or exc}") from None
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise RuntimeDirError(f"runtime dir {path} is writable by group/others "
                              f"(mode {stat.S_IMODE(st.st_mode):o}); refusing to start")
    if st.st_uid != os.getuid():
        raise RuntimeDirError(f"runtime dir {path} belongs to uid {st.st_uid}, not us")


class RunLock:
    """The held lock; :meth:`release` removes the file (only its holder ever does)."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self.fd = fd

    def release(self) -> None:
        if self.fd < 0:
            return
        try:
            os.unlink(self.path)      # while still holding it: see acquire's inode check
        except FileNotFoundError:
            pass
        os.close(self.fd)
        self.fd = -1


def _holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""


def acquire(runtime_dir: str) -> RunLock:
    """Take the runtime dir's lock or raise :class:`AlreadyRunning`; never blocks.

    A holder unlinks the file before closing it, so a lock taken on a file that is no
    longer the one at ``path`` is retried on the new one: two daemons can never each
    believe they own the dir.
    """
    path = os.path.join(runtime_dir, LOCK_FILE)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _holder(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise AlreadyRunning(
                    f"another offbroadway daemon{holder} is running on {runtime_dir} "
                    f"(it holds {path}); not starting") from None
            raise
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return RunLock(path, fd)
