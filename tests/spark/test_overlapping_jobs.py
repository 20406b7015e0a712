"""Why a dataset takes one Spark job at a time: two overlapping appends lose rows silently.

Spark's file commit (``mapreduce.fileoutputcommitter.algorithm.version`` 2, as the
committer writes) keeps every job's task output under the same ``<dataset>/_temporary``
until the task commits, and a job's end (its commit, or its abort) removes that folder
whole.  So when two jobs append to one dataset at once and the first ends while a task
of the second has written its rows and not yet committed them, those rows go: the second
job still reports success.  The committer never runs two (one committer per dataset, the
dataset lock among local writers, and an earlier incarnation's jobs settled before the
first write: docs/design-spark.md §5), and this is what that spares.  Here: job A held
5 s and job B held 15 s before their task commits (tests/spark/slow_commit.py), B
started while A waits; both succeed, and only A's rows are in the dataset.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.spark import slow_commit
from tests.spark.conftest import start_server

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_two_overlapping_appends_to_one_dataset_lose_the_later_ones_rows(
        tmp_path: Path) -> None:
    from pyspark.sql.connect.client import DefaultChannelBuilder
    from pyspark.sql.connect.session import SparkSession

    flag = tmp_path / "hold.flag"
    taken = Path(f"{flag}.taken")
    server = start_server(tmp_path / "srv", conf=slow_commit.build(tmp_path, flag))
    sessions = []
    try:
        for _ in range(2):
            builder = DefaultChannelBuilder(server.remote)
            builder.set("token", server.token)
            sessions.append(SparkSession.builder.channelBuilder(builder).create())
        out = str(tmp_path / "dataset")
        done: dict[str, str] = {}

        def append(spark, name: str, first: int) -> None:
            try:
                spark.range(first, first + 100).repartition(1).write.mode("append") \
                    .option("mapreduce.fileoutputcommitter.algorithm.version", "2") \
                    .parquet(out)
                done[name] = "ok"
            except Exception as exc:
                done[name] = f"{type(exc).__name__}: {str(exc)[:300]}"

        def held(ms: int, name: str, first: int, spark) -> threading.Thread:
            flag.write_text(str(ms))
            job = threading.Thread(target=append, args=(spark, name, first))
            job.start()
            deadline = time.monotonic() + 120
            while not taken.exists():   # its task holds before its commit
                assert time.monotonic() < deadline and job.is_alive(), done
                time.sleep(0.02)
            taken.unlink()
            return job

        a = held(5_000, "A", 0, sessions[0])
        b = held(15_000, "B", 1_000, sessions[1])
        a.join(120)
        b.join(120)
        assert done == {"A": "ok", "B": "ok"}, done   # both jobs say they committed
        ids = {r.id for r in sessions[0].read.parquet(out).collect()}
        assert ids == set(range(100)), (len(ids), min(ids), max(ids))   # B's rows gone
    finally:
        for spark in sessions:
            spark.stop()
        server.stop()
