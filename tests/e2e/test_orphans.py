"""What a user's handler starts dies with the daemon, even when the daemon is SIGKILLed.

The kernel's PDEATHSIG reaches only the stage processes; each stage asks for a catchable
one (``GUARD_SIGNAL``) and kills its own descendants on it (``guard_descendants``).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import psutil

from tests.conftest import start_daemon, wait_until
from tests.e2e.test_pipeline import make_config, write_spool


def _gone(pid: int, created: float) -> bool:
    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - created) > 0.01 or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_handlers_subprocesses_are_gone_after_the_daemons_sigkill(short_tmp: Path) -> None:
    write_spool(short_tmp / "spool", 200, files=1)
    config = make_config(short_tmp, handler="tests.e2e.handlers:SpawnsSubprocesses",
                         processors=1,
                         batchers={"even": {"batch_size": 10, "batch_timeout": 0.2},
                                   "odd": {"batch_size": 10, "batch_timeout": 0.2}})
    out = short_tmp / "out"
    daemon = start_daemon(config)
    pids: list[int] = []
    try:
        files = wait_until(lambda: sorted(out.glob("children-*.json")), timeout=60,
                           message="the processor's subprocesses")
        pids = [pid for f in files for pid in json.loads(f.read_text())]
        created = {pid: psutil.Process(pid).create_time() for pid in pids}
        stages = [int(f.stem.split("-")[1]) for f in files]
        assert all(psutil.Process(p).ppid() in stages for p in pids)
        daemon.kill()
        daemon.wait(timeout=10)
        wait_until(lambda: all(_gone(p, created[p]) for p in pids), timeout=20,
                   message="the handlers' subprocesses killed with their stages")
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
