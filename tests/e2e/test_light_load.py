"""Light load end to end (issue 6): K ≤ C jobs arriving at once on C idle processors start
on K distinct processors at once, with one producer and with several; a backlog of long
jobs is shared round by round; and the plain GenStage dispatcher (``dispatcher =
"demand"``) still works, showing the pile-up it is kept to demonstrate (seed 003).

The jobs arrive only once every processor has placed demand at every producer (producers
report their demand once a second), by renaming spool files in; their names are chosen
so the spool's ``crc32(name) % producers`` split gives each producer one.
"""

from __future__ import annotations

import os
import signal
import time
import zlib
from pathlib import Path

import pytest
from offbroadway.supervision.tree import snapshot_nodes

from tests.conftest import start_daemon, wait_until
from tests.e2e.light_handlers import read_jobs
from tests.e2e.test_pipeline import make_config

JOB_SECONDS = 1.0


def one_name_per_producer(producers: int, jobs: int) -> list[str]:
    names: list[str] = []
    taken: dict[int, int] = {}
    i = 0
    while len(names) < jobs:
        name = f"job-{i:04d}.jsonl"
        p = zlib.crc32(name.encode()) % producers
        if taken.get(p, 0) < -(-jobs // producers):
            taken[p] = taken.get(p, 0) + 1
            names.append(name)
        i += 1
    return names


def demand_placed(sock: Path, producers: int, processors: int) -> bool:
    """Every processor has demand outstanding at every producer (its ``edges``: per
    upstream, events handled and demand out), and every producer counts it.

    A producer's total alone is not enough: two processors of ``max_demand`` 10 make it
    20 while the other two have not subscribed yet, and the jobs would go to the two."""
    from offbroadway.daemon.cli import control

    try:
        status = control.request(str(sock), {"cmd": "status"}, timeout=5)["status"]
    except (control.ControlError, OSError, ValueError):
        return False
    nodes = list(snapshot_nodes(status["tree"]))
    demands = [n.get("messages", {}).get("demand", 0) for n in nodes
               if n["id"].startswith("producer_")]
    edges = [n.get("messages", {}).get("edges", {}) for n in nodes
             if n["id"].startswith("processor_")]
    return (len(demands) == producers and all(d >= processors for d in demands)
            and len(edges) == processors
            and all(len(e) == producers and all(out > 0 for _, out in e.values())
                    for e in edges))


def run_burst(tmp: Path, producers: int, processors: int, jobs: int,
              dispatcher: str = "spread", one_file: bool = False) -> tuple[float, list[dict]]:
    spool = tmp / "spool"
    staging = tmp / "staging"
    spool.mkdir()
    staging.mkdir()
    if one_file:
        names = ["jobs.jsonl"]
        (staging / names[0]).write_text("".join(f'{{"seq": {i}}}\n' for i in range(jobs)))
    else:
        names = one_name_per_producer(producers, jobs)
        for i, name in enumerate(names):
            (staging / name).write_text(f'{{"seq": {i}}}\n')
    config = make_config(tmp, handler="tests.e2e.light_handlers:Sleeper",
                         processors=processors, producers=producers,
                         context={"job_seconds": JOB_SECONDS},
                         options={"path": str(spool), "scan_interval": 0.01})
    text = config.read_text().replace("[producer]\n", f'[producer]\ndispatcher = "{dispatcher}"\n')
    config.write_text(text)
    daemon = start_daemon(config)
    try:
        sock = tmp / "run" / "control.sock"
        wait_until(lambda: demand_placed(sock, producers, processors), timeout=60,
                   message="every processor's demand at every producer")
        arrival = time.time()
        for name in names:
            os.rename(staging / name, spool / name)
        out = str(tmp / "out")
        records = wait_until(lambda: len(r := read_jobs(out)) == jobs and r, timeout=30,
                             message=f"{jobs} jobs to run")
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            code = daemon.wait(60)
        except Exception:
            daemon.kill()
            raise
    assert code == 0, daemon.stderr.read()[-3000:]
    return arrival, records


@pytest.mark.parametrize("producers,processors,jobs,one_file",
                         [(4, 5, 4, False), (1, 4, 4, True)])
def test_simultaneous_jobs_start_at_once_on_distinct_processors(
        short_tmp: Path, producers: int, processors: int, jobs: int, one_file: bool) -> None:
    arrival, records = run_burst(short_tmp, producers, processors, jobs, one_file=one_file)
    assert len({r["pid"] for r in records}) == jobs, "two jobs went to one processor"
    waits = [r["start"] - arrival for r in records]
    # a job queued behind another would start a whole job later
    assert max(waits) < 0.75 * JOB_SECONDS, f"waits {waits}"


def test_plain_genstage_dispatcher_still_runs_and_piles_up(short_tmp: Path) -> None:
    arrival, records = run_burst(short_tmp, 1, 3, 3, dispatcher="demand", one_file=True)
    # GenStage gives the whole frame to the biggest demand: one processor, one at a time
    assert len({r["pid"] for r in records}) == 1
    assert max(r["start"] for r in records) - arrival >= 2 * JOB_SECONDS * 0.9


def test_a_backlog_of_long_jobs_is_shared_round_by_round(short_tmp: Path) -> None:
    """More jobs than processors, two per producer at once: idle processors drawing one
    job from each producer give back what they cannot start (RETURN), so every round
    runs on every processor and no job waits two rounds."""
    arrival, records = run_burst(short_tmp, 3, 3, 6)
    per_pid: dict[int, int] = {}
    for r in records:
        per_pid[r["pid"]] = per_pid.get(r["pid"], 0) + 1
    assert sorted(per_pid.values()) == [2, 2, 2], per_pid
    latest = max(r["start"] for r in records) - arrival
    assert latest < 1.6 * JOB_SECONDS, f"a job started {latest:.2f}s after arrival"
