"""The guardian: a small process that outlives the supervising process only to kill what it
leaves behind.

PR_SET_PDEATHSIG takes the workers along when the supervising process dies, even by
SIGKILL, but only them: what a worker started (a subprocess in a group or a session of its
own, a daemonized helper, a JVM) is orphaned to init, and outside systemd (whose cgroup
would be killed whole) nothing is left to kill it.  A worker that cooperates can guard its
own descendants (:func:`.child.guard_descendants`), but not every worker is Python, nor
free to run a signal handler when the signal comes.

So the first spawn of a supervising process starts one guardian: ``python -I -S`` running
this file (standard library only, nothing of the package imported), in a session of its
own (a terminal's Ctrl-C and a kill of the daemon's group miss it), holding the read end of
a pipe whose write end only the supervising process holds (close-on-exec: no child
inherits it).  Every child is spawned with :data:`TREE_ENV` set to the guardian's token in
its environment, which everything it starts inherits.  When the supervising process ends,
however it ends, the kernel closes the write end; the guardian reads EOF, SIGKILLs every
process whose environment carries the token (found under ``/proc``; sweeping until a pass
finds none, so what forked meanwhile goes too), and exits.  After a clean stop it finds
nothing.  Why this and not a PID namespace (its init's death kills everything inside): one
needs privileges or user namespaces that containers and hardened hosts often refuse; the
guardian needs nothing but ``/proc``.  Limits: a descendant started with an environment of
its own (``env -i``) or running as another user is not found by its token (the workers'
own guard still finds it through the process tree while its parent lives); a supervising
process that forks without exec shares the write end with its fork, and the guardian waits
for both.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

#: the environment variable that marks every process of one supervising process's tree
TREE_ENV = "OFFBROADWAY_TREE"
#: passes of the sweep at most, and the pause between two
SWEEPS, SWEEP_PAUSE = 50, 0.02

_started: tuple[int, str, int] | None = None   # (pid of the supervising process, token, fd)


def token() -> str:
    """This process's guardian token, starting the guardian on first use (and again in a
    forked process, which needs a guardian of its own)."""
    global _started
    if _started is not None and _started[0] == os.getpid():
        return _started[1]
    import secrets

    tok = f"{os.getpid()}-{secrets.token_hex(12)}"
    rfd, wfd = os.pipe()            # both close-on-exec: no child inherits the write end
    env = {k: v for k, v in os.environ.items() if k != TREE_ENV}
    subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), str(rfd), tok],
                     pass_fds=(rfd,), start_new_session=True, env=env,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    os.close(rfd)
    _started = (os.getpid(), tok, wfd)   # the write end stays open for our whole life
    return tok


def marked(needle: bytes, me: int) -> list[int]:
    """Pids of the processes whose environment holds ``needle`` (``NAME=value``)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if env.startswith(needle + b"\0") or (b"\0" + needle + b"\0") in env \
                or env.endswith(b"\0" + needle) or env == needle:
            out.append(int(name))
    return out


def sweep(tok: str) -> int:
    """SIGKILL every process marked with ``tok`` until a pass finds none; how many."""
    needle, me, killed = f"{TREE_ENV}={tok}".encode(), os.getpid(), 0
    for _ in range(SWEEPS):
        pids = marked(needle, me)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        time.sleep(SWEEP_PAUSE)
    return killed


def main(argv: list[str]) -> int:
    fd, tok = int(argv[1]), argv[2]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            if not os.read(fd, 64):
                break                   # EOF: the supervising process is gone
        except InterruptedError:
            continue
        except OSError:
            break
    sweep(tok)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
