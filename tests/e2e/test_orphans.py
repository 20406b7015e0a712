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


def test_every_kind_of_handler_process_is_gone_after_the_daemons_sigkill(
        short_tmp: Path) -> None:
    """A real ``offbroadway run``, SIGKILLed: what each processor's handle_message started
    in a process group of its own, in a session of its own, as a grandchild, and
    daemonized (orphaned at once, a session of its own: no longer a descendant of the
    stage) is gone within a deadline."""
    from tests.e2e.handlers import read_records

    write_spool(short_tmp / "spool", 200, files=1)
    config = make_config(short_tmp, handler="tests.e2e.handlers:SpawnsEveryKind",
                         processors=2,
                         batchers={"even": {"batch_size": 10, "batch_timeout": 0.2},
                                   "odd": {"batch_size": 10, "batch_timeout": 0.2}})
    out = short_tmp / "out"
    daemon = start_daemon(config)
    kinds: dict[int, str] = {}
    try:
        # every message handled: each processor that got any has started its processes
        wait_until(lambda: len(read_records(str(out), "batch-")) >= 200, timeout=60,
                   message="the spool handled")
        files = sorted(out.glob("children-*.json"))
        assert files
        for f in files:
            stage = int(f.stem.split("-")[1])
            started = json.loads(f.read_text())
            assert set(started) == {"own_group", "own_session", "grandchild", "daemonized"}
            for kind, pid in started.items():
                kinds[pid] = kind
            proc = {k: psutil.Process(p) for k, p in started.items()}
            assert all(p.name() == "sleep" for p in proc.values())
            assert os.getpgid(started["own_group"]) == started["own_group"]
            assert os.getsid(started["own_session"]) == started["own_session"]
            assert stage in [a.pid for a in proc["grandchild"].parents()]
            # what the test is about: the daemonized one left the stage's tree
            assert os.getsid(started["daemonized"]) == started["daemonized"]
            assert stage not in [a.pid for a in proc["daemonized"].parents()]
        created = {pid: psutil.Process(pid).create_time() for pid in kinds}
        daemon.kill()
        daemon.wait(timeout=10)
        left: list[str] = []

        def all_gone() -> bool:
            left[:] = sorted(kinds[p] for p in kinds if not _gone(p, created[p]))
            return not left

        try:
            wait_until(all_gone, timeout=20,
                       message="the handlers' processes killed with their stages")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {left} still alive") from None
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        for pid in kinds:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_daemon_sigkill_then_restart_loses_nothing(short_tmp: Path) -> None:
    """Deterministic, outside the random chaos run: SIGKILL the daemon with work in flight,
    check every stage died with it, start it again: every line is handled, the spool is
    fully acked, and duplicates are only lines the first run's source had unacked.

    The sink stalls after its first 1000 messages per batch processor (a gate the test
    lifts after the kill), so the kill finds work in flight however slowly the test gets
    to it: under load, the status calls before the kill used to outlast the whole run."""
    from collections import Counter

    from tests.e2e.daemon_status import producer_books
    from tests.e2e.handlers import read_records
    from tests.e2e.test_pipeline import run_until_idle, spool_settled, stage_pids

    n = 6000
    write_spool(short_tmp / "spool", n, files=3)
    gate = short_tmp / "gate"
    gate.touch()
    config = make_config(short_tmp, handler="tests.e2e.backpressure_handlers:GatedRecorder",
                         context={"slow": 0.0005, "gate": str(gate), "open_for": 1000},
                         batchers={"even": {"batch_size": 100, "batch_timeout": 0.5},
                                   "odd": {"batch_size": 100, "batch_timeout": 0.5}})
    sock = short_tmp / "run" / "control.sock"
    out = short_tmp / "out"
    daemon = start_daemon(config)
    try:
        wait_until(lambda: len(read_records(str(out), "batch-")) >= 1000, timeout=60,
                   message="messages to flow")
        # stalled, the pipeline holds still: two reports (a tick apart) that agree are
        # what the source had unacked at the kill
        seen: list[int] = []
        wait_until(lambda: seen.append(producer_books(sock).get("unacked", 0)) or (
            len(seen) >= 2 and seen[-1] == seen[-2] > 0), timeout=60, interval=1.1,
            message="the source's unacked count settled behind the stalled sink")
        unacked = seen[-1]
        pids = stage_pids(sock)
        created = {s: psutil.Process(p).create_time() for s, p in pids.items()}
        first = Counter(r["id"] for r in read_records(str(out), "batch-"))
        assert unacked > 0 and len(first) < n, (unacked, len(first))
        daemon.kill()
        daemon.wait(timeout=10)
        wait_until(lambda: all(_gone(pids[s], created[s]) for s in pids), timeout=20,
                   message="every stage gone with the daemon")
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        gate.unlink()
    # the first run's books as it left them: what it wrote, and what its source settled
    written = Counter(r["id"] for r in read_records(str(out), "batch-"))
    settled = spool_settled(short_tmp / "state", short_tmp / "spool")
    proc = run_until_idle(config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = Counter(r["id"] for r in read_records(str(out), "batch-"))
    assert len(counts) == n, f"{n - len(counts)} lines lost across the daemon's SIGKILL"
    dups = sum(c - 1 for c in counts.values())
    assert dups <= unacked, (dups, unacked)
    # exactly: what the first run wrote and its source had not settled comes again, once
    assert max(written.values()) == 1 and max(counts.values()) <= 2
    assert {i for i, c in counts.items() if c > 1} == set(written) - settled
    assert not list((short_tmp / "spool").glob("*.jsonl")), "spool not fully acked"
