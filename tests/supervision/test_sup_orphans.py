"""Children never outlive the process that supervises them, even after its SIGKILL, and
a terminal's Ctrl-C does not reach them (their own process groups)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest
from offbroadway.supervision import spawn as spawn_mod

from tests.conftest import wait_until

from .conftest import RUN_TREE, gone, read_log


def _start_tree(log, method="setpriv"):
    # its own process group, as a daemon started from a shell would be
    env = {**os.environ, spawn_mod.METHOD_ENV: method}
    proc = subprocess.Popen([sys.executable, str(RUN_TREE), str(log)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, process_group=0, env=env)
    line = proc.stdout.readline()
    assert line, "run_tree.py died before starting its tree"
    pids = json.loads(line)["pids"]
    created = {cid: psutil.Process(pid).create_time() for cid, pid in pids.items()}
    return proc, pids, created


@pytest.mark.parametrize("method", ["setpriv", "preexec"])
def test_kill_9_of_the_supervising_process_leaves_no_child(log, method):
    if method == "setpriv" and spawn_mod.find_setpriv() is None:
        pytest.skip("no setpriv with --pdeathsig here")
    proc, pids, created = _start_tree(log, method)
    try:
        assert sorted(pids) == ["a", "b", "c", "d"]
        for pid in pids.values():
            assert psutil.Process(pid).ppid() == proc.pid
        proc.kill()
        proc.wait(timeout=10)
        wait_until(lambda: all(gone(pids[c], created[c]) for c in pids), timeout=20,
                   message="PDEATHSIG to kill every child")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_children_have_own_process_groups_and_ctrl_c_does_not_reach_them(log):
    proc, pids, created = _start_tree(log)
    try:
        for pid in pids.values():
            assert os.getpgid(pid) == pid != os.getpgid(proc.pid)
        # Ctrl-C: SIGINT to the foreground process group (the tree's); its handler then
        # stops the children in order, with SIGTERM, which each child logs
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        stops = [c for a, c, _ in read_log(log) if a == "stop"]
        assert stops == ["d", "c", "b", "a"]
        assert all(gone(pids[c], created[c]) for c in pids)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_child_orphaned_before_pdeathsig_took_hold_exits_at_ready(tmp_path):
    """The gap of the setpriv way: a supervisor that died between spawn and prctl.  The
    child, leading its own process group but no longer the supervisor's child, must exit
    in notify_ready instead of running unsupervised."""
    r, w = os.pipe()
    code = ("from offbroadway.supervision import child\n"
            "child.notify_ready()\n"
            "print('still running')\n")
    env = {**os.environ, "OFFBROADWAY_NOTIFY_FD": str(w),
           "OFFBROADWAY_SUPERVISOR_PID": str(os.getpid() + 999999)}  # someone else
    try:
        orphan = subprocess.run([sys.executable, "-c", code], env=env, pass_fds=(w,),
                                process_group=0, capture_output=True, text=True, timeout=30)
        assert orphan.returncode == 70 and "still running" not in orphan.stdout
        env["OFFBROADWAY_SUPERVISOR_PID"] = str(os.getpid())  # the real parent: fine
        kept = subprocess.run([sys.executable, "-c", code], env=env, pass_fds=(w,),
                              process_group=0, capture_output=True, text=True, timeout=30)
        assert kept.returncode == 0 and "still running" in kept.stdout
        assert os.read(r, 16) == b"R"  # only the second one said ready
    finally:
        os.close(r)
        os.close(w)
