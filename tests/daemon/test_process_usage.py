"""Each child's memory and CPU, read from /proc as ``status`` and ``/metrics`` show them,
against psutil's reading of the same real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
from offbroadway.daemon.observe.usage import process_usage

#: a process that spends some CPU, takes ~60 MB and starts a child that takes ~40 MB
PARENT = """
import subprocess, sys, time
ballast = bytearray(60_000_000)
t = time.process_time()
while time.process_time() - t < 0.3:
    pass
kid = subprocess.Popen([sys.executable, "-c",
                        "import sys; b = bytearray(40_000_000); print('up', flush=True); "
                        "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
kid.stdout.readline()
print("ready", flush=True)
sys.stdin.read()
"""


def test_figures_match_psutil_and_a_tree_adds_its_descendants() -> None:
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        parent = psutil.Process(proc.pid)
        kid = parent.children()[0]
        own = process_usage(proc.pid)
        assert own is not None
        rss, cpu = own
        assert abs(rss - parent.memory_info().rss) < 4 * 2**20, (rss, parent.memory_info())
        assert rss > 60_000_000
        times = parent.cpu_times()
        assert cpu >= 0.25 and abs(cpu - (times.user + times.system)) < 0.05, (cpu, times)
        whole = process_usage(proc.pid, tree=True)
        assert whole is not None
        expected = parent.memory_info().rss + kid.memory_info().rss
        assert abs(whole[0] - expected) < 8 * 2**20, (whole, expected)
        assert whole[0] > rss + 40_000_000
        assert whole[1] >= cpu
    finally:
        proc.kill()
        proc.wait(10)
    assert process_usage(proc.pid) is None      # reaped: gone, not an error

def test_our_own_figures_move_with_what_we_use() -> None:
    before = process_usage(os.getpid())
    assert before is not None
    ballast = bytearray(80_000_000)
    for i in range(0, len(ballast), 4096):     # touch every page: resident now
        ballast[i] = 1
    t = time.process_time()
    while time.process_time() - t < 0.2:
        pass
    after = process_usage(os.getpid())
    assert after is not None
    assert after[0] - before[0] > 70_000_000, (before, after)
    assert after[1] - before[1] >= 0.15, (before, after)
    del ballast
