"""A job of a SIGKILLed committer that the server finishes afterwards.

The window this closes (docs/design-spark.md §5): a committer dies while its job runs; a
server that does not see the connection drop (a cluster behind a partition, a host that
died) carries the job on; the next incarnation reads the last commits back, and looks
redelivered messages up, *before* that job's rows land, so their redelivered copies are
written again.  Every incarnation's Spark Connect session id is journaled before its
first call, and a new incarnation interrupts the earlier sessions' operations and waits,
asking the server (``GetStatus``), until none runs, before it reads anything back.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.conftest import test_env, wait_until

pytestmark = pytest.mark.spark

HERE = Path(__file__).resolve().parent

ROWS, MS_PER_ROW = 200, 40      # one task of 8 s


def operations(spark_server, session_id: str) -> list[int]:
    """The states of session ``session_id``'s operations, as the server reports them."""
    from offbroadway.stages.spark.spark_sink import SparkSink
    from pyspark.sql.connect.client import SparkConnectClient

    sink = SparkSink(output="/nonexistent", writer_id="observer")
    client = SparkConnectClient(connection=sink._builder(session_id))
    try:
        return [o.state for o in client._get_operation_statuses().operation_statuses]
    finally:
        client.close()


@pytest.mark.parametrize("settle", [True, pytest.param(False, marks=[
    pytest.mark.slow,
    pytest.mark.xfail(strict=True, reason="without waiting the earlier session out, its job "
                                          "lands after the read: the window this closes")])])
def test_the_next_incarnation_reads_back_only_once_the_dead_ones_job_is_over(
        spark_server, sink_env, tmp_path, settle: bool) -> None:
    from offbroadway.stages.spark.spark_once import Journal
    from offbroadway.stages.spark.spark_sink import SparkSink
    from pyspark.sql.connect.proto import base_pb2

    running = base_pb2.GetStatusResponse.OperationStatus.OPERATION_STATE_RUNNING
    out = tmp_path / "out"
    journal = Journal(str(tmp_path / "journal" / "p.spark"))
    # incarnation 1: session and stamp journaled before the job, as the committer does
    session = str(uuid.uuid4())
    journal.add_session(session)
    stamp = datetime.now(UTC).replace(tzinfo=None)
    journal.record(stamp.replace(tzinfo=UTC))
    proc = subprocess.Popen([sys.executable, str(HERE / "slow_job_proc.py"), session,
                             str(out / "spark"), stamp.isoformat(sep=" "), str(ROWS),
                             str(MS_PER_ROW)], env=test_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "started", proc.stderr.read()
        wait_until(lambda: running in operations(spark_server, session), timeout=60,
                   interval=0.1, message="the slow job running on the server")
        proc.kill()
        proc.wait()
        t_killed = time.monotonic()
        # incarnation 2
        sink = SparkSink(output=str(out), writer_id="committer_spark",
                         session_id=str(uuid.uuid4()))
        if settle:
            for earlier in journal.sessions():
                assert sink.settle_session(earlier) == 1
        read_back = set(sink.ids_of("spark", journal.last()).to_pylist())
        # the dead incarnation's job, left alone, would have ended by now
        job_end = t_killed + ROWS * MS_PER_ROW / 1000 + 3
        while time.monotonic() < job_end:
            final = set(sink.ids_of("spark", journal.last()).to_pylist())
            assert final == read_back, (
                f"{len(final - read_back)} row(s) of the dead incarnation's job landed "
                f"after the next one read its last commits back")
            time.sleep(0.5)
        sink.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
