"""A lone message lands within a few seconds with the shipped Spark defaults.

Under load the row count starts the Spark jobs; a lone message waits instead for
``batch_timeout`` in its batcher and ``commit_interval`` in the committer, then one job.
So with config/example.toml as shipped, the job that writes a line dropped into an idle
pipeline's spool starts after ``batch_timeout + commit_interval`` and before that plus the
spool's scan interval and the hand-offs between the stages; the row is in the dataset one
job later (docs/config.md, docs/design-spark.md §4).  The job's start is read from the row
itself (``ingested_at``, the commit's stamp, taken as its job starts): the job's own
time, long on a loaded machine, is not the bound's business.
"""

from __future__ import annotations

import signal
import subprocess
import time
import tomllib
from datetime import UTC
from pathlib import Path

import pytest
from offbroadway.daemon.config.load import load_config

from tests.conftest import REPO, offbroadway_cmd, wait_until
from tests.spark.test_pipeline_spark import daemon_env, example_config, rows

pytestmark = pytest.mark.spark

#: the hand-offs between stages (frames, a Parquet file staged), on a loaded machine
HANDOFFS = 2.0


def test_a_lone_line_lands_within_batch_timeout_plus_commit_interval(short_tmp: Path,
                                                                     spark_server) -> None:
    spool, out = short_tmp / "spool", short_tmp / "orders"
    spool.mkdir()
    config = example_config(short_tmp, spool, out, spark_server)
    loaded = load_config(str(config)).config
    assert "commit_interval" not in tomllib.loads(config.read_text())["spark"]   # the default
    batch_timeout = loaded.batchers["spark"].batch_timeout
    interval = loaded.spark.commit_interval
    scan = 1.0   # the spool's default scan_interval
    assert batch_timeout + interval <= 5.0, "a lone message should land within a few seconds"
    lines = (REPO / "examples" / "spool" / "orders-0000.jsonl").read_text().splitlines()

    def drop(name: str, line: str) -> float:
        tmp = spool / f".{name}.tmp"
        tmp.write_text(line + "\n")
        tmp.rename(spool / f"{name}.jsonl")
        return time.time()

    daemon = subprocess.Popen(offbroadway_cmd("run", str(config)), cwd=REPO,
                              env=daemon_env(spark_server), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        # the first line creates the dataset (its first commit fixes the schema)
        drop("a", lines[0])
        wait_until(lambda: rows(out, "spark"), timeout=120, interval=0.2,
                   message="the first row")
        # then one line alone, timed to its row in the dataset
        t0 = drop("b", lines[1])
        found = wait_until(lambda: [r for r in rows(out, "spark")
                                    if r["message_id"].startswith("b.jsonl")],
                           timeout=60, interval=0.2, message="the lone line's row")
        landed = time.time() - t0
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, err = daemon.communicate(timeout=120)
    assert daemon.returncode == 0, err[-3000:]
    stamp = found[0]["ingested_at"]
    started = (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp() - t0
    assert batch_timeout + interval - 0.2 <= started <= \
        scan + batch_timeout + interval + HANDOFFS, \
        f"the lone line's job started {started:.2f} s after it (in the dataset {landed:.2f} s)"
