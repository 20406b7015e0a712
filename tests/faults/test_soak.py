"""The soak bench (bench/soak.py) for five minutes: RabbitMQ → pipeline → the daemon's own
Spark at a steady rate, with a stage SIGKILLed every 20 s, an operator restart and a
reload every minute and the Spark JVM SIGKILLed once, sampled every 10 s.

The books must balance (every published id in the dataset, nothing else, nothing
dead-lettered, the queue empty, exit 0 on SIGTERM) and the dirs must stay within their
ceilings in every sample: the metrics dir at most 3 files per running stage plus the
archives, the runtime dir the stages' fixed files, the state dir the Spark server's.
The hour-long run and its slopes are in docs/reliability.md.
"""

from __future__ import annotations

import sys

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.soak, pytest.mark.slow, pytest.mark.spark, pytest.mark.broker]

sys.path.insert(0, str(REPO / "bench"))

STAGES = 5          # producer, 2 processors, batcher, batch processor
#: the metrics dir: 3 files per stage process (one more incarnation of each may overlap
#: its predecessor's files for a moment) plus the archives
METRICS_FILES = 3 * 2 * STAGES + 3
#: the runtime dir: per stage a socket and (processors) a blame file, the hub and control
#: sockets, the lock, the rate-limit file, the Spark server's, plus the metrics dir's own
RUNTIME_FILES = 4 * STAGES + 10 + METRICS_FILES
#: the state dir: the Spark server's logs, conf, pid and port files and its scratch
STATE_FILES = 400


def test_five_minute_soak_balances_its_books_and_keeps_its_dirs_bounded() -> None:
    import soak

    opts = soak.SoakOptions(minutes=5, rate=1000, kill_every=20, restart_every=60,
                            reload_every=60, jvm_every=150, sample_every=10, seed=27)
    report = soak.run_soak(opts, say=lambda line: print(line, flush=True))
    for line in soak.summary(report):
        print(line)
    assert not report["problems"], report["problems"]
    b = report["books"]
    assert b["published"] >= 150_000, b    # at least half the rate held (a busy machine)
    assert b["lost"] == 0 and b["strangers"] == 0 and b["dead_lettered"] == 0, b
    assert b["distinct"] == b["published"], b
    assert report["exit_code"] == 0
    counts = report["event_counts"]
    assert counts.get("kill", 0) >= 8 and counts.get("restart", 0) >= 3, counts
    assert counts.get("reload", 0) >= 3 and counts.get("jvm", 0) >= 1, counts
    samples = [s["values"] for s in report["samples"]]
    assert len(samples) >= 20, len(samples)
    worst = {k: max(s.get(k, 0) for s in samples)
             for k in ("dir_metrics_files", "dir_runtime_files", "dir_state_files")}
    assert worst["dir_metrics_files"] <= METRICS_FILES, worst
    assert worst["dir_runtime_files"] <= RUNTIME_FILES, worst
    assert worst["dir_state_files"] <= STATE_FILES, worst
    assert all("scrape_ms" in s for s in samples), "a /metrics scrape failed"
