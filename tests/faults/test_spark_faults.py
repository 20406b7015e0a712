"""Spark faults that are not a dead JVM: its output on a disk that fills up, and a JVM
given too little memory.

A full output disk: Spark's write fails with the file system's reason, the sink retries
with back-off (one line per attempt, so a bounded number), nothing is acked meanwhile, and
once space is back the retried write goes through: every message in the dataset, exit 0.
A driver heap too small for Spark: refused by ``check`` and ``run`` with one line naming
the key, before anything starts (a JVM given a few MiB dies at start without a reason).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, offbroadway_cmd, test_env
from tests.e2e.test_pipeline import make_config, write_spool
from tests.spark.test_pipeline_spark import spark_section


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
