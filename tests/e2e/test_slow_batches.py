"""Batches go to a free batch processor (Broadway subscribes batch processors with
``max_demand: 1, min_demand: 0``): with a slow ``handle_batch`` every batch processor
works, and the batches take about as long as the batch processors could do them in.

200 messages, ``batch_size`` 10 (20 batches), ``batch_timeout`` 30 s (so every batch is
cut by size, at once), two processors and two batch processors whose ``handle_batch``
sleeps 50 ms: ideally 10 batches each, 0.5 s from the first batch's start to the last
one's end.  With a fixed demand of ~1000 messages' worth of batches (before), a batch
processor took every batch there was: all 20 when it came up first (a cold start with
``--until-idle``: the source is read while the batch processors are still starting one
after the other; not tested here, since how long the second one takes to start is the
machine's load), and, with both up, the batches queued behind one that took long while
its sibling idled (the second case: one batch of 1 s; 1.55 s against an ideal of 1.0 s
before).  The messages arrive once the whole tree is up (a spool file renamed in), so
what is measured is dispatch.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import start_daemon, wait_until
from tests.e2e.daemon_status import tree_nodes
from tests.e2e.light_handlers import read_jobs
from tests.e2e.test_pipeline import make_config

N, BATCH_SIZE, BATCH_PROCESSORS, BATCH_SECONDS = 200, 10, 2, 0.05


def _config(tmp: Path, spool: Path, slow_seconds: float = BATCH_SECONDS) -> Path:
    # default demand everywhere (processors 1000/500, batch processors the topology's)
    return make_config(tmp, handler="tests.e2e.light_handlers:SlowBatch", max_demand=1000,
                       context={"batch_seconds": BATCH_SECONDS, "slow_seconds": slow_seconds},
                       options={"path": str(spool), "scan_interval": 0.01},
                       batchers={"default": {"batch_size": BATCH_SIZE, "batch_timeout": 30.0,
                                             "concurrency": BATCH_PROCESSORS}})


def _lines(slow_first: bool) -> str:
    return "".join(json.dumps({"seq": i, "slow": slow_first and i == 0}) + "\n"
                   for i in range(N))


@pytest.mark.parametrize("slow_seconds", [BATCH_SECONDS, 1.0])
def test_slow_batches_go_to_every_batch_processor_within_1_3x_of_ideal(
        short_tmp: Path, slow_seconds: float) -> None:
    """With ``slow_seconds`` 1.0 the first batch takes 1 s."""
    spool, staging = short_tmp / "spool", short_tmp / "staging"
    spool.mkdir()
    staging.mkdir()
    (staging / "part-000.jsonl").write_text(_lines(slow_seconds != BATCH_SECONDS))
    daemon = start_daemon(_config(short_tmp, spool, slow_seconds))
    try:
        sock = short_tmp / "run" / "control.sock"

        def up() -> bool:
            try:
                nodes = tree_nodes(sock)
            except Exception:
                return False
            workers = [x for x in nodes.values() if x["kind"] == "worker" and x["pid"]]
            return len(workers) == 6 and all(x["state"] == "running" for x in workers)

        wait_until(up, timeout=60, message="every stage running")
        os.rename(staging / "part-000.jsonl", spool / "part-000.jsonl")
        out = str(short_tmp / "out")

        def all_through() -> list[dict]:
            records = read_jobs(out)
            return records if sum(b["size"] for b in records) == N else []

        batches = wait_until(all_through, timeout=30, message=f"{N} messages handled")
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            code = daemon.wait(60)
        except Exception:
            daemon.kill()
            raise
    assert code == 0, daemon.stderr.read()[-3000:]
    per_pid = Counter(b["pid"] for b in batches)
    assert len(per_pid) == BATCH_PROCESSORS, f"one batch processor got every batch: {per_pid}"
    makespan = max(b["end"] for b in batches) - min(b["start"] for b in batches)
    # the ideal: the batches' own time (as slept here, load included) spread evenly, or
    # the longest batch if that is longer
    took = [b["end"] - b["start"] for b in batches]
    ideal = max(sum(took) / BATCH_PROCESSORS, max(took))
    assert makespan <= 1.3 * ideal, (makespan, ideal, per_pid)

