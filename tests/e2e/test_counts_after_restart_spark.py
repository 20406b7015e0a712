"""The end of a run counts from the commits themselves, and an operator's restart says
what it did, with real Spark.

An operator restarts the batch processors while their committer runs a Spark job: the
job may commit batches whose batch processors are gone by the time it answers, so those
messages are requeued and come back.  ``wrote N rows`` used to count only the rows the
batch processors acked (it missed the batches logged "Spark write abandoned" at the
restart: the dataset had more rows than it said), the batch processor claimed those rows
were "not committed yet", and ``restart`` printed only ``restart: ok``.  Since the
committer puts the rows of such commits in doubt, what comes back is acknowledged
without being written again: every line is in the dataset once, and ``wrote`` says so.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, offbroadway_cmd, test_env, wait_until
from tests.spark.test_pipeline_spark import (
    committing,
    daemon_env,
    one_batcher_into_spark,
    rows,
    start_logged,
)

pytestmark = pytest.mark.spark


def test_rows_written_are_the_rows_committed_and_restart_says_what_it_did(
        short_tmp: Path, spark_server) -> None:
    n = 12_000
    config, out = one_batcher_into_spark(short_tmp, spark_server, n)
    sock = short_tmp / "run" / "control.sock"
    daemon, log = start_logged(config, short_tmp, daemon_env(spark_server))
    try:
        wait_until(lambda: committing(sock, "committer_default"), timeout=120, interval=0.2,
                   message="the committer in a Spark job")
        restart = subprocess.run(
            offbroadway_cmd("restart", "batch_processor_default_0", "--socket", str(sock)),
            cwd=REPO, env=test_env(), capture_output=True, text=True, timeout=120)
        stdout, _ = daemon.communicate(timeout=300)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    err = log.read_text()
    assert daemon.returncode == 0, err[-3000:]
    written = rows(out, "default")
    assert sorted(r["seq"] for r in written) == list(range(n)), \
        f"{len(written) - n} rows more than lines, or lines missing"
    assert len({r["message_id"] for r in written}) == n

    # the rows written are the rows in the dataset, counted from the commits
    wrote = re.search(rf"^e2e: wrote (\d+) rows to {re.escape(str(out))}/default \(parquet\)"
                      rf"(.*)$", stdout, re.M)
    assert wrote, stdout
    assert int(wrote[1]) == len(written), (wrote[0], len(written))
    assert f"e2e: {n} messages acked, 0 failed" in stdout, stdout
    # nothing claimed those rows were not committed
    assert "not committed yet" not in err, [ln for ln in err.splitlines()
                                            if "not committed yet" in ln]

    # the operator's restart said which stages restarted and what went back to the source
    assert restart.returncode == 0, restart.stderr
    said = restart.stdout.strip()
    assert re.fullmatch(r"restart: restarted batch_processor_default_0, "
                        r"batch_processor_default_1 \(the cascade of batch_processor_default_0"
                        r"\); \d+ in-flight messages? requeued at the source", said), said
    requeued = int(re.search(r"; (\d+) in-flight", said)[1])
    logged = sum(int(k) for k in re.findall(r"requeued (\d+) in-flight messages", err))
    assert requeued == logged, (said, logged)
