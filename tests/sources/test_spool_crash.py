"""Crash recovery of the spool with real processes: a process using the spool source is
SIGKILLed, and a fresh source in a new process must yield exactly the lines it had not
settled: nothing acknowledged read twice, nothing fetched-but-unacked lost."""

from __future__ import annotations

import json
import os
import random
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import SpoolDirs, worker_env

WORKER = Path(__file__).with_name("spool_worker.py")


class Worker:
    """A spool-using subprocess whose stdout we read line by line with deadlines."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.proc = subprocess.Popen([sys.executable, str(WORKER), json.dumps(job)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=worker_env(), bufsize=0)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
        self._buf = b""

    def readline(self, timeout: float = 15.0) -> str:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"worker said nothing for {timeout}s")
            if self._sel.select(left):
                chunk = os.read(self.proc.stdout.fileno(), 65536)  # type: ignore[union-attr]
                if not chunk:
                    err = self.proc.wait(5)
                    raise AssertionError(f"worker exited ({err}) before a full line")
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(10) == -signal.SIGKILL
        self._sel.close()
        for f in (self.proc.stdin, self.proc.stdout):
            f.close()  # type: ignore[union-attr]


def run_drain(spool: SpoolDirs, index: int = 0, count: int = 1) -> list[list]:
    """What a fresh source in a new process delivers: ``[file, line, data, error]`` each."""
    job = {"path": str(spool.path), "state": str(spool.state), "index": index,
           "count": count, "mode": "drain"}
    out = subprocess.run([sys.executable, str(WORKER), json.dumps(job)], env=worker_env(),
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def keyset(rows: list[list]) -> set[tuple[str, int]]:
    keys = [(r[0], r[1]) for r in rows]
    assert len(keys) == len(set(keys)), "a line was delivered twice by one source"
    return set(keys)


def fill(spool: SpoolDirs, files: int, lines: int) -> set[tuple[str, int]]:
    for f in range(files):
        spool.write(f"part-{f:02d}.jsonl", [{"f": f, "i": i} for i in range(lines)])
    return {(f"part-{f:02d}.jsonl", i) for f in range(files) for i in range(1, lines + 1)}


def test_sigkill_after_acks_yields_exactly_the_unsettled_lines(spool: SpoolDirs) -> None:
    everything = fill(spool, files=3, lines=40)
    spool.write("part-99.jsonl", ["{ok}"], raw=True)       # settled by failing it
    everything.add(("part-99.jsonl", 1))
    acked = {k for k in everything if k[1] % 3 == 0 or (k[0] == "part-01.jsonl" and k[1] < 20)}
    acked |= {("part-02.jsonl", i) for i in range(1, 41)}   # a whole file: moved aside
    failed = {("part-00.jsonl", 1), ("part-99.jsonl", 1)}
    w = Worker({"path": str(spool.path), "state": str(spool.state), "mode": "settle",
                "ack": sorted(acked), "fail": sorted(failed)})
    assert w.readline() == "SETTLED"
    w.kill()                       # mid-life: fetched lines it never acked are in the air

    again = keyset(run_drain(spool))
    assert again == everything - acked - failed
    assert (spool.done / "part-02.jsonl").exists() and (spool.done / "part-99.jsonl").exists()
    dead = [json.loads(x) for x in spool.dead_letter.read_text().splitlines()]
    assert {(d["file"], d["line"]) for d in dead} == failed
    assert {d["reason"] for d in dead} == {"boom"}
    # a drain settles nothing, so a second restart yields the same lines again
    assert keyset(run_drain(spool)) == again


def test_sigkill_mid_stream_of_acks_loses_nothing_and_rereads_nothing(
        spool: SpoolDirs) -> None:
    """Kill while acks stream in: what comes back is everything but a prefix of the frames
    acked (plus part of the next), and every frame the worker reported acked is settled."""
    everything = fill(spool, files=4, lines=600)
    frame, seed = 7, 1234
    w = Worker({"path": str(spool.path), "state": str(spool.state), "mode": "stream",
                "frame": frame, "seed": seed})
    reported = -1
    while reported < 30:
        line = w.readline()
        assert line.startswith("ACKED "), line
        reported = int(line.split()[1])
    w.kill()

    again = keyset(run_drain(spool))
    order = sorted(everything)
    random.Random(seed).shuffle(order)            # the worker's frame order, reproduced
    frames = [set(order[k:k + frame]) for k in range(0, len(order), frame)]
    settled = everything - again
    m = 0
    covered: set = set()
    while m < len(frames) and frames[m] <= settled:
        covered |= frames[m]
        m += 1
    # an ack() spanning several files records them file by file, so the kill may have
    # landed inside the frame after the prefix: part of it settled, the rest comes back
    partial = settled - covered
    assert m == len(frames) or partial <= frames[m], "settled lines beyond the ack frames"
    assert m > reported, "a frame reported acked came back"
    assert again, "the worker finished before the kill: make the job bigger"


def test_two_producer_processes_partition_the_spool(spool: SpoolDirs) -> None:
    everything = fill(spool, files=10, lines=20)
    got = [keyset(run_drain(spool, index=i, count=2)) for i in range(2)]
    assert got[0] and got[1]
    assert not got[0] & got[1]
    assert got[0] | got[1] == everything


@pytest.mark.parametrize("producers_after", [1, 3])
def test_records_stay_valid_when_the_producer_count_changes(
        spool: SpoolDirs, producers_after: int) -> None:
    """Records are keyed by file name, so whoever owns a file after a change knows its acks."""
    everything = fill(spool, files=6, lines=10)
    acked = {k for k in everything if k[1] <= 4}
    workers = []
    for i in range(2):
        mine = run_drain(spool, index=i, count=2)
        w = Worker({"path": str(spool.path), "state": str(spool.state), "index": i,
                    "count": 2, "mode": "settle",
                    "ack": sorted(k for k in keyset(mine) if k in acked)})
        assert w.readline() == "SETTLED"
        workers.append(w)
    for w in workers:
        w.kill()
    after: set = set()
    for i in range(producers_after):
        part = keyset(run_drain(spool, index=i, count=producers_after))
        assert not part & after
        after |= part
    assert after == everything - acked
