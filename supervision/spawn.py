"""Starting an OS process that cannot outlive its supervisor.

What the child gets before its program runs:

* ``PR_SET_PDEATHSIG = SIGKILL`` (or the spec's ``pdeathsig``): the kernel kills the child
  when the thread that forked it dies, even when the daemon itself is SIGKILLed and runs no
  clean-up.  A child whose own children must go too asks for a catchable signal and calls
  :func:`.child.guard_descendants` (the stages do).
* its own process group (``process_group=0``): a terminal's Ctrl-C goes to the foreground
  group only, so the daemon alone decides how and when children stop; and the group lets
  a SIGKILL reach whatever the child forked.
* the write end of the notify pipe, at the fd number named in ``OFFBROADWAY_NOTIFY_FD``,
  and the supervisor's pid in ``OFFBROADWAY_SUPERVISOR_PID``.
* the token of the supervising process's guardian in ``OFFBROADWAY_TREE``, inherited by
  everything the child starts: when the supervising process dies, however, the guardian
  kills every process that carries it (:mod:`.guardian`).

Two ways to set PDEATHSIG, chosen once (``OFFBROADWAY_PDEATHSIG`` overrides):

``setpriv`` (default where util-linux's ``setpriv --pdeathsig`` exists): the child execs
``setpriv --pdeathsig KILL -- ARGV``.  No Python runs between fork and exec, so
``subprocess`` can use vfork: 0.3 ms per spawn from a daemon-sized parent, against 5-7 ms
for a Python ``preexec_fn`` (the forked child copies every page it touches).  If the daemon
dies in the instant before setpriv's prctl, the child would run orphaned:
:func:`.child.notify_ready` closes that gap by exiting when its parent is no longer the
supervisor (``bench/restart_latency.py`` measures both ways).

``preexec``: ``prctl`` through ctypes in a ``preexec_fn``, then ``getppid()`` is checked
against the daemon's pid, so there is no gap at all, whatever the child runs.

PDEATHSIG follows the *thread* that forked: spawn from the thread that runs the event loop
for the daemon's whole life (asyncio's loop thread), never from a short-lived thread.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence

from .child import NOTIFY_FD_ENV, SUPERVISOR_PID_ENV
from .linux import guardian

METHOD_ENV = "OFFBROADWAY_PDEATHSIG"
PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)
_prctl = _libc.prctl
_prctl.restype = ctypes.c_int
_prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                   ctypes.c_ulong)
_SIGKILL = int(signal.SIGKILL)
_setpriv: str | bool | None = False  # False: not looked for yet


def die_with(parent: int, sig: int = _SIGKILL) -> Callable[[], None]:
    """A ``preexec_fn`` that gives the child ``sig`` when ``parent`` dies
    (``PR_SET_PDEATHSIG``), and ends it at once if ``parent`` is already gone (compared
    with the pid it forked from, not with 1: a subreaper may adopt orphans).  Built in the
    parent so the child only calls, never imports.  Also what the Spark server wrapper
    puts on its JVM."""

    def setup() -> None:
        if _prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
        if os.getppid() != parent:  # the parent died before the prctl took effect
            os.kill(os.getpid(), _SIGKILL)

    return setup


def find_setpriv() -> str | None:
    """setpriv's path if it knows ``--pdeathsig`` (util-linux 2.33+), else None."""
    global _setpriv
    if _setpriv is False:
        path = shutil.which("setpriv")
        if path is not None:
            try:
                help_text = subprocess.run([path, "--help"], capture_output=True, text=True,
                                           timeout=10).stdout
            except (OSError, subprocess.SubprocessError):
                help_text = ""
            if "--pdeathsig" not in help_text:
                path = None
        _setpriv = path
    return _setpriv  # type: ignore[return-value]


def method() -> str:
    """``setpriv`` or ``preexec`` (see the module's doc)."""
    forced = os.environ.get(METHOD_ENV)
    if forced in ("setpriv", "preexec"):
        return forced
    return "setpriv" if find_setpriv() else "preexec"


def _resolve(program: str, path: str, cwd: str | None) -> str:
    """What exec would run, so a missing program fails the start as clearly as exec would
    (setpriv would only exit 127)."""
    if os.sep in program:
        found = os.path.join(cwd, program) if cwd else program
        if os.path.isfile(found) and os.access(found, os.X_OK):
            return program
        raise FileNotFoundError(2, "No such executable", program)
    hit = shutil.which(program, path=path)
    if hit is None:
        raise FileNotFoundError(2, "No such executable in PATH", program)
    return hit


def signal_name(sig: int) -> str:
    """``sig`` as setpriv spells it (``KILL``, ``USR2``, ``RTMIN+3``)."""
    rtmin = int(signal.SIGRTMIN)
    if rtmin <= sig <= int(signal.SIGRTMAX):
        return f"RTMIN+{sig - rtmin}"
    return signal.Signals(sig).name.removeprefix("SIG")


def spawn(argv: Sequence[str], env: Mapping[str, str], cwd: str | None,
          notify_fd: int, pdeathsig: int = _SIGKILL) -> subprocess.Popen:
    """Start ``argv`` with ``env`` added to ours; raises OSError if it cannot be executed.

    ``pdeathsig`` is what the child gets when we die (see :attr:`.spec.WorkerSpec.pdeathsig`).

    stdin is /dev/null (a daemon's children must not read the terminal); stdout and
    stderr are inherited, so children log where the daemon logs (the journal).
    """
    argv = list(argv)
    full_env = dict(os.environ)
    full_env.update(env)
    full_env[NOTIFY_FD_ENV] = str(notify_fd)
    full_env[SUPERVISOR_PID_ENV] = str(os.getpid())
    # the mark the guardian kills by once we are gone, whatever the child starts
    full_env[guardian.TREE_ENV] = guardian.token()
    how = method()
    if how == "setpriv":
        program = _resolve(argv[0], full_env.get("PATH", os.defpath), cwd)
        setpriv = find_setpriv()
        if setpriv is not None:
            return subprocess.Popen(
                [setpriv, "--pdeathsig", signal_name(pdeathsig), "--", program, *argv[1:]],
                env=full_env,
                cwd=cwd, stdin=subprocess.DEVNULL, pass_fds=(notify_fd,), process_group=0)
    return subprocess.Popen(
        argv, env=full_env, cwd=cwd, stdin=subprocess.DEVNULL, pass_fds=(notify_fd,),
        process_group=0,
        preexec_fn=die_with(os.getpid(), pdeathsig))
