"""Resizing a running pipeline that writes to Spark: batch processors and processors grown
and shrunk mid-stream (the sequence of :mod:`tests.e2e.test_resize`); a batch processor
that leaves waits for its batches' group commit before it goes.  Exactly one row per
message in the dataset, the spool fully acked, nothing requeued, no restart counted, and
the end-of-run line counts the rows of the batch processors that left."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.handlers import read_records
from tests.e2e.test_operations import free_port
from tests.e2e.test_pipeline import write_spool
from tests.e2e.test_resize import resizable_config, resize_midstream
from tests.spark.test_pipeline_spark import TOKEN_ENV, daemon_env, rows, spark_section

# long: not in the default run (pytest -m slow)
pytestmark = [pytest.mark.slow, pytest.mark.spark]


def test_scale_up_and_down_midstream_spark_exact_rows(short_tmp: Path, spark_server) -> None:
    n = 12_000
    write_spool(short_tmp / "spool", n, files=3, extra={"route": "default"})
    port = free_port()
    config = resizable_config(short_tmp, port)
    out = short_tmp / "dataset"
    config.write_text(config.read_text() + spark_section(
        out, remote=spark_server.remote, token_env=TOKEN_ENV, commit_rows=2000,
        commit_interval=0.5))
    run = resize_midstream(short_tmp, config, port, n,
                           lambda: len(read_records(str(short_tmp / "out"), "batch-")),
                           env=daemon_env(spark_server))
    written = rows(out, "default")
    seqs = Counter(r["seq"] for r in written)
    assert len(seqs) == n, f"{n - len(seqs)} lines have no row"
    assert max(seqs.values()) == 1, "a line was written twice with nothing failing"
    assert not list((short_tmp / "spool").glob("*.jsonl")), "spool not fully acked"
    assert f"wrote {n} rows to {out}/default" in run["stdout"], run["stdout"]
    assert f"e2e: {n} messages acked, 0 failed" in run["stdout"], run["stdout"]
