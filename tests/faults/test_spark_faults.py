"""Spark faults that are not a dead JVM: its output on a disk that fills up, and a JVM
given too little memory.

A full output disk: Spark's write fails with the file system's reason, the sink retries
with back-off (one line per attempt, so a bounded number), nothing is acked meanwhile, and
once space is back the retried write goes through: every message in the dataset, exit 0.
A driver heap too small for Spark: refused by ``check`` and ``run`` with one line naming
the key, before anything starts (a JVM given a few MiB dies at start without a reason).
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, offbroadway_cmd, test_env, wait_until
from tests.e2e.test_pipeline import make_config, write_spool
from tests.faults.test_disk_full import Filler, tmpfs  # noqa: F401 (a fixture)
from tests.spark.test_pipeline_spark import (TOKEN_ENV, assert_each_message_once_or_duplicated_whole,
                                             daemon_env, rows, spark_section, stage_stats,
                                             status)

N = 6000


@pytest.mark.spark
def test_spark_output_disk_full_retries_then_writes_everything(short_tmp: Path,
                                                               spark_server, tmpfs: Path
                                                               ) -> None:
    write_spool(short_tmp / "spool", N, files=6)
    out = tmpfs / "dataset"
    config = make_config(short_tmp, batchers={"default": {"batch_size": 250,
                                                          "batch_timeout": 0.2}})
    text = config.read_text().replace(
        "[producer]\n", "[producer]\nrate_limit = { allowed_messages = 250, interval = 0.25 }\n")
    config.write_text(text + spark_section(out, remote=spark_server.remote,
                                           token_env=TOKEN_ENV, commit_rows=500,
                                           commit_interval=0.2, write_retry_seconds=300))
    log = short_tmp / "daemon.log"
    sock = short_tmp / "run" / "control.sock"
    filler = Filler(tmpfs)
    with open(log, "w") as f:
        daemon = subprocess.Popen(offbroadway_cmd("run", str(config), "--until-idle"),
                                  cwd=REPO, env=daemon_env(spark_server), stdout=f,
                                  stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: len(rows(out, "default")) >= 500, timeout=180, interval=0.5,
                   message="a first rows committed")
        filler.start()
        wait_until(lambda: "No space left" in log.read_text(), timeout=120, interval=0.5,
                   message="a Spark write failing with the file system's reason")
        acked = status(sock).get("acked")
        t_full = time.monotonic()
        time.sleep(8.0)             # held full: the sink retries, nothing is acked
        held = time.monotonic() - t_full
        assert status(sock).get("acked") == acked, "acked while Spark could not write"
        lines = [ln for ln in log.read_text().splitlines() if "Spark write attempt" in ln]
        # the sink's back-off: doubling from its first wait, so at most a log2 ramp plus
        # one attempt per capped wait in the time held (and the writers before it)
        assert len(lines) <= 2 * (math.ceil(math.log2(held / 0.5 + 1)) + 6), lines[-5:]
        committer = stage_stats(status(sock)).get("committer_default", {})
        filler.release()
        assert daemon.wait(300) == 0, log.read_text()[-4000:]
    except BaseException:
        print(log.read_text()[-6000:])
        raise
    finally:
        if filler._thread.is_alive():
            filler.release()
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(30)
    text = log.read_text()
    assert "Traceback" not in text, text[-4000:]
    found = rows(out, "default")
    duplicates = assert_each_message_once_or_duplicated_whole(found, N)
    print(f"\nspark output full: {len(lines)} attempt lines in {held:.1f}s held, "
          f"{duplicates} duplicate rows; committer {json.dumps(committer)[:200]}")


@pytest.mark.parametrize("memory", ["8m", "256m", "lots"])
def test_a_driver_heap_too_small_is_refused_with_one_line(short_tmp: Path, memory: str
                                                          ) -> None:
    """``driver_memory = "8m"`` used to start a JVM that died at once ("A JNI error has
    occurred", exit 1, the daemon's line saying only "see the log"); 256m starts a JVM that
    Spark itself refuses (it wants 450 MiB).  Both, and a value that is no size, are
    refused before anything starts: exit 2, one line naming the key, the spool untouched."""
    write_spool(short_tmp / "spool", 500, files=1)
    config = make_config(short_tmp, batchers={"default": {"batch_size": 100}})
    config.write_text(config.read_text() + spark_section(
        short_tmp / "dataset", master="local[1]", driver_memory=memory))
    for verb in ("check", "run"):
        res = subprocess.run(offbroadway_cmd(verb, str(config)), cwd=REPO, env=test_env(),
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 2, (verb, res.stderr[-2000:])
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "spark.driver_memory" in lines[0], lines
        assert "Traceback" not in res.stderr
    assert len(list((short_tmp / "spool").glob("*.jsonl"))) == 1
    assert not (short_tmp / "run").exists() or not (short_tmp / "run" / "metrics").exists()
