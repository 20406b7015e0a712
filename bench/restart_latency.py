"""Restart latency: SIGKILL of a supervised worker until its replacement reports ready.

    .venv/bin/python bench/restart_latency.py [--kills 100] [--worker zmq|stage|bare]

The worker imports what a stage imports before it can say ready (``zmq``, ``msgpack`` and
``offbroadway.supervision.child``; ``--worker stage`` also imports the stage runtime
module ``offbroadway.stages.runtime.stage``; ``bare`` imports nothing, the interpreter's floor).
Each kill waits for the replacement before the next, so the figures are one restart at a
time.  Besides kill→ready it splits the time into: exit noticed (kill → ChildExited via
pidfd), spawn (the fork/exec call in the supervisor, PDEATHSIG included) and the child's
own start-up (spawn → ``R`` on the notify pipe).  Last, it measures what PDEATHSIG's
``preexec_fn`` costs per spawn against a plain ``Popen``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time

import zmq  # noqa: F401  - the supervising process is a daemon with zmq loaded
from offbroadway.supervision import (
    Strategy,
    Supervisor,
    SupervisorSpec,
    WorkerSpec,
)
from offbroadway.supervision import process as process_mod
from offbroadway.supervision import spawn as spawn_mod

LOOP = ("import time\nwhile True:\n    child.heartbeat()\n    time.sleep(1)\n")
WORKERS = {
    "bare": "import os\nos.write(int(os.environ['OFFBROADWAY_NOTIFY_FD']), b'R')\n"
            "import time\nwhile True:\n    time.sleep(1)\n",
    "zmq": "import zmq, msgpack\nfrom offbroadway.supervision import child\n"
           "child.notify_ready()\n" + LOOP,
    "stage": "import zmq, msgpack\nimport offbroadway.stages.runtime.stage\n"
             "from offbroadway.supervision import child\nchild.notify_ready()\n" + LOOP,
}


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (p99 of 100 samples is the 99th smallest)."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.4999)))
    return ordered[rank - 1]


def summary(name: str, ms: list[float]) -> str:
    return (f"{name:<38} median {statistics.median(ms):7.1f}  p99 {pct(ms, 99):7.1f}  "
            f"mean {statistics.fmean(ms):7.1f}  min {min(ms):7.1f}  max {max(ms):7.1f} ms")


async def restarts(kills: int, code: str, methods: list[str]) -> dict[str, list[float]]:
    """``kills`` kills per PDEATHSIG method, the methods alternating kill by kill so that
    the load of a shared machine falls on both alike."""
    started: dict[int, float] = {}
    exited: dict[int, float] = {}
    spawned: list[tuple[float, float]] = []  # (call start, call end)
    real_spawn = process_mod.spawn

    def timed_spawn(*args, **kwargs):
        t0 = time.perf_counter()
        popen = real_spawn(*args, **kwargs)
        spawned.append((t0, time.perf_counter()))
        return popen

    process_mod.spawn = timed_spawn

    def on_event(event: object) -> None:
        now = time.perf_counter()
        kind = type(event).__name__
        if kind == "ChildStarted":
            started[event.pid] = now  # type: ignore[attr-defined]
        elif kind == "ChildExited":
            exited[event.pid] = now  # type: ignore[attr-defined]

    spec = WorkerSpec("stage_0", argv=[sys.executable, "-c", code], shutdown=2.0)
    sup = Supervisor(SupervisorSpec("bench", Strategy.ONE_FOR_ONE, [spec],
                                    max_restarts=10 * kills, max_seconds=1.0), on_event)
    await sup.start()
    out: dict[str, list[float]] = {}
    try:
        worker = sup.find("stage_0")
        for i in range(kills * len(methods)):
            how = methods[i % len(methods)]
            os.environ[spawn_mod.METHOD_ENV] = how
            old = worker.pid
            assert old is not None
            n_spawns = len(spawned)
            t_kill = time.perf_counter()
            os.kill(old, signal.SIGKILL)
            while True:
                pid = worker.pid
                if pid is not None and pid != old and pid in started:
                    break
                await asyncio.sleep(0.001)
            s0, s1 = spawned[n_spawns]
            for name, ms in (("kill → ready", started[pid] - t_kill),
                             ("kill → exit noticed", exited[old] - t_kill),
                             ("spawn call", s1 - s0),
                             ("spawn → ready (child)", started[pid] - s1)):
                out.setdefault(f"[{how}] {name}", []).append(ms * 1e3)
    finally:
        await sup.stop()
        process_mod.spawn = real_spawn
    return out


def spawn_cost(n: int = 50) -> dict[str, list[float]]:
    """The supervisor's side of a spawn of /bin/true, each way, and with no PDEATHSIG."""
    out: dict[str, list[float]] = {}
    for _ in range(n):
        r, w = os.pipe()
        for how in ("setpriv", "preexec"):
            os.environ[spawn_mod.METHOD_ENV] = how
            t0 = time.perf_counter()
            p = spawn_mod.spawn(["/bin/true"], {}, None, w)
            out.setdefault(f"spawn via {how}", []).append((time.perf_counter() - t0) * 1e3)
            p.wait()
        out.setdefault("plain Popen (no PDEATHSIG)", [])
        t0 = time.perf_counter()
        q = subprocess.Popen(["/bin/true"], stdin=subprocess.DEVNULL, pass_fds=(w,),
                             process_group=0)
        out["plain Popen (no PDEATHSIG)"].append((time.perf_counter() - t0) * 1e3)
        q.wait()
        os.close(r)
        os.close(w)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=100)
    p.add_argument("--worker", choices=sorted(WORKERS), default="zmq")
    p.add_argument("--pdeathsig", choices=["auto", "setpriv", "preexec", "both"],
                   default="auto", help="how children get PR_SET_PDEATHSIG (see spawn.py)")
    p.add_argument("--no-bytecode", action="store_true",
                   help="keep PYTHONDONTWRITEBYTECODE if set (children then recompile the "
                        "project's own modules at every start)")
    a = p.parse_args()
    if not a.no_bytecode:
        # A daemon under systemd writes and reuses bytecode caches; a development shell
        # may forbid them, which would make every start recompile the project's modules.
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    methods = {"auto": [spawn_mod.method()], "both": ["setpriv", "preexec"]}.get(
        a.pdeathsig, [a.pdeathsig])
    print(f"{a.kills * len(methods)} SIGKILLs of a '{a.worker}' worker; {os.cpu_count()} CPUs; "
          f"python {sys.version.split()[0]}; exit watch: "
          f"{'pidfd' if process_mod.exitwatch.pidfd_supported() else 'SIGCHLD'}; "
          f"PDEATHSIG via {' and '.join(methods)}; bytecode cache "
          f"{'off' if os.environ.get('PYTHONDONTWRITEBYTECODE') else 'on'}; "
          f"load average {os.getloadavg()[0]:.2f}")
    results = asyncio.run(restarts(a.kills, WORKERS[a.worker], methods))
    for name, ms in results.items():
        print(summary(name, ms))
    for name, ms in spawn_cost().items():
        print(summary(name, ms))
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
