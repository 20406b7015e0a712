"""Run a small supervision tree in a process of its own, as the daemon would.

    run_tree.py LOG [--max-restarts N]

Tree: ``root`` (one_for_one) → ``a``, ``inner`` (one_for_all, max_restarts 0) → ``b``,
``c``; then ``d``.  Prints ``{"pids": {id: pid}}`` on one line once started.  SIGTERM or
SIGINT: ordered stop, exit 0.  The root giving up: exit 1 (the daemon's contract: systemd
restarts it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from offbroadway.supervision import Strategy, Supervisor, SupervisorSpec

from tests.supervision.conftest import worker


async def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("log", type=Path)
    p.add_argument("--max-restarts", type=int, default=3)
    a = p.parse_args()
    spec = SupervisorSpec("root", Strategy.ONE_FOR_ONE, max_restarts=a.max_restarts, children=[
        worker("a", a.log),
        SupervisorSpec("inner", Strategy.ONE_FOR_ALL, max_restarts=0,
                       children=[worker("b", a.log), worker("c", a.log)]),
        worker("d", a.log)])
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sup = Supervisor(spec)
    await sup.start()
    pids: dict[str, int | None] = {}
    sup.walk(lambda n: pids.__setitem__(n.id, n.pid) if n.kind == "worker" else None)
    print(json.dumps({"pids": pids}), flush=True)
    failed = asyncio.ensure_future(sup.wait_failed())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({failed, stopping}, return_when=asyncio.FIRST_COMPLETED)
    await sup.stop()
    if failed.done():
        print(json.dumps({"failed": failed.result()}), flush=True)
        return 1
    failed.cancel()
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(asyncio.run(main()))
