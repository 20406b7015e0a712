"""The output's file system full: one line with the file system's reason, the source
held, nothing lost; the pipeline resumes when space returns.

The dataset lives on a small tmpfs mounted for the test (root; CI runs as root), filled
by a file of the test's before the daemon starts.  Spark's jobs then fail in their
tasks; the committer retries them (``write_retry_seconds``) and says why on one line,
naming the file system's error, not only Spark's "task failed while writing rows".  The
test removes its file; the next attempt commits, and every spool line is in the dataset
once.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, offbroadway_cmd, wait_until
from tests.e2e.test_pipeline import make_config, write_spool
from tests.spark.dataset import assert_each_message_exactly_once, rows
from tests.spark.test_pipeline_spark import (
    TOKEN_ENV,
    daemon_env,
    spark_section,
    stage_stats,
    status,
)

# the network partition is the default run's representative fault (tests/brokers/
# test_spark_network.py); this one is slow (pytest -m slow, ~60 s)
pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def small_disk(short_tmp: Path):
    """A 2 MiB tmpfs at ``<tmp>/dataset``."""
    where = short_tmp / "dataset"
    where.mkdir()
    if os.geteuid() != 0:
        if os.environ.get("OFFBROADWAY_REQUIRE_CI_TOOLS"):
            pytest.fail("mounting a tmpfs needs root")
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0777", "tmpfs", str(where)],
                   check=True, capture_output=True, timeout=30)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def fill(where: Path) -> Path:
    """Fill the file system at ``where`` to the last block; returns the filler."""
    filler = where / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return filler


def test_a_full_output_disk_says_why_holds_the_source_and_resumes(
        short_tmp: Path, spark_server, small_disk: Path) -> None:
    n = 20_000
    write_spool(short_tmp / "spool", n, files=2, extra={"route": "even"})
    config = make_config(short_tmp, batchers={
        "even": {"batch_size": 500, "batch_timeout": 0.5, "concurrency": 1}},
        shutdown_timeout=60.0)
    config.write_text(config.read_text() + spark_section(small_disk, remote=spark_server.remote,
                                    token_env=TOKEN_ENV, commit_rows=2000,
                                    commit_interval=0.5, write_retry_seconds=300))
    filler = fill(small_disk)
    log = short_tmp / "daemon.err"
    with open(log, "w") as err:
        daemon = subprocess.Popen(offbroadway_cmd("run", str(config), "--until-idle"),
                                  cwd=REPO, env=daemon_env(spark_server),
                                  stdout=subprocess.DEVNULL, stderr=err)
    sock = short_tmp / "run" / "control.sock"
    try:
        line = wait_until(lambda: re.search(r".*Spark write attempt \d+ failed.*",
                                            log.read_text()),
                          timeout=300, interval=0.2, message="a failed write attempt").group(0)
        assert "No space left on device" in line, line
        # the source is held while Spark cannot write: once the stages are full (the
        # third attempt), nothing more is fetched for 3 s
        wait_until(lambda: "Spark write attempt 3 failed" in log.read_text(), timeout=120,
                   interval=0.2, message="a third failed attempt")
        fetched = stage_stats(status(sock))["producer_0"]["in"]
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3:
            assert stage_stats(status(sock))["producer_0"]["in"] == fetched
            time.sleep(0.5)   # sampling a stretch of time, not waiting for a state
        assert not rows(short_tmp / "dataset", "even")
        filler.unlink()
        code = daemon.wait(600)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    err = log.read_text()
    assert code == 0, err[-3000:]
    assert_each_message_exactly_once(rows(short_tmp / "dataset", "even"), n)
    assert not list((short_tmp / "spool").glob("*.jsonl")), "lines left unacked"
    print("\n" + line)
