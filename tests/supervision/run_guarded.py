"""Supervise one ``children/guarded.py`` in a process of its own, as the daemon would.

    run_guarded.py PIDFILE guard|plain

``guard``: the child's spec asks for ``GUARD_SIGNAL`` and the child guards its descendants;
``plain``: the default SIGKILL, unguarded.  Prints ``ready`` once the child is up; the
test then SIGKILLs this process.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from offbroadway.supervision import Strategy, Supervisor, SupervisorSpec, WorkerSpec
from offbroadway.supervision.child import GUARD_SIGNAL

CHILD = Path(__file__).resolve().parent / "children" / "guarded.py"


async def main() -> None:
    pidfile, mode = sys.argv[1], sys.argv[2]
    argv = [sys.executable, str(CHILD), pidfile] + (["--guard"] if mode == "guard" else [])
    extra = {"pdeathsig": GUARD_SIGNAL} if mode == "guard" else {}
    sup = Supervisor(SupervisorSpec("root", Strategy.ONE_FOR_ONE, children=[
        WorkerSpec("guarded", argv, start_timeout=20.0, **extra)]))
    await sup.start()
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
