"""The committer's job lifecycle, driven through its seam with a fake Spark.

:class:`CommitterJobs` is the committer without its process: no socket, no thread, no
pyspark.  Here it gets a real journal and a real staging area in a temporary directory
and, in place of the Spark sink, :class:`FakeSpark`: a dataset in memory that reads the
staged Parquet files it is given and remembers each row's stamp, as Spark's ``ingested_at``
does.  The three cases: a commit, a restart with a job in doubt, a failed write.  The
real sink's side of each is in tests/spark (test_sink.py, test_pipeline_spark.py).
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Sequence

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from offbroadway.stages.roles.committer_jobs import MERGED_PREFIX, CommitterJobs, Job, SparkPort
from offbroadway.stages.runtime.spec import CommitterSpark, SinkSettings
from offbroadway.stages.spark import spark_rows
from offbroadway.stages.spark.spark_commit import Handed
from offbroadway.stages.spark.spark_failures import CommitFailed
from offbroadway.stages.spark.spark_once import Journal
from offbroadway.stages.spark.spark_staging import StagingDir, staged_name

DATA = pa.schema([("seq", pa.int64())])
BP = b"batch_processor_default_0"


class FakeSpark:
    """The Spark side of one dataset, in memory: ``rows`` is what Spark holds, as
    (message_id, seq, stamp); ``fail`` makes the next commits raise :class:`CommitFailed`
    as the real sink does once its retries are spent (or when Spark rejects the job)."""

    connect_timeout = 2.0

    def __init__(self, rows: list[tuple[str, int, datetime]] | None = None) -> None:
        self.rows = rows if rows is not None else []
        self.fail: CommitFailed | None = None
        self.commits: list[tuple[datetime, list[str]]] = []
        self.settled: list[str] = []
        self._last = datetime(2026, 1, 1, tzinfo=UTC)

    def data_schema(self) -> pa.Schema | None:
        return None   # no DDL

    def existing_schema(self, batcher: str) -> pa.Schema | None:
        return DATA if self.rows else None

    def settle_session(self, session_id: str) -> int:
        self.settled.append(session_id)
        return 0

    def ids_of(self, batcher: str, stamps: Sequence[datetime]) -> pa.Array:
        return pa.array([i for i, _, s in self.rows if s in stamps], pa.string())

    def ids_present(self, batcher: str, ids: pa.Array) -> pa.Array:
        held = {i for i, _, _ in self.rows}
        return pa.array([i for i in ids.to_pylist() if i in held], pa.string())

    def next_stamp(self) -> datetime:
        self._last += timedelta(seconds=1)
        return self._last

    def commit_files(self, batcher: str, files: Sequence[str], schema: pa.Schema,
                     rows: int | None = None, stamp: datetime | None = None,
                     stamped: bool = False) -> datetime:
        assert stamp is not None
        self.commits.append((stamp, list(files)))
        if self.fail is not None:
            raise self.fail
        for uri in files:
            if stamped:   # the file carries the commit's stamp, every row of it
                stamps = pq.read_table(uri.removeprefix("file://")).column("ingested_at")
                assert set(stamps.to_pylist()) == {stamp}, (stamps, stamp)
            table = pq.read_table(uri.removeprefix("file://"), schema=schema)
            self.rows.extend((i, s, stamp) for i, s in zip(table.column("message_id").to_pylist(),
                                                           table.column("seq").to_pylist()))
        return stamp

    def probe(self, timeout: float = 2.0) -> str | None:
        return None

    def close(self) -> None:
        pass


def committer(tmp: Path, spark: FakeSpark) -> CommitterJobs:
    """A committer as the stage builds one, with ``spark`` behind its seam; its schema
    job done (as the stage's helper thread would run it)."""
    sink: SparkPort = spark
    jobs = CommitterJobs(CommitterSpark(sink=SinkSettings(output=str(tmp / "out")),
                                        commit_rows=100, commit_interval=4.0),
                         writer="committer_default", batcher="default", counters=Counter(),
                         journal=Journal(str(tmp / "journal" / "t.default")), sink=sink,
                         staging=StagingDir(str(tmp / "staging" / "default")))
    jobs.new_session()
    job = jobs.schema_job()
    jobs.prepare(job)
    assert jobs.finish(job) is None and jobs.schema_known
    return jobs


def hand(jobs: CommitterJobs, ref: int, seqs: range, *, at: float = 0.0) -> Handed:
    """A batch processor's batch ``ref``: staged, then handed over (a COMMIT frame)."""
    assert jobs.staging is not None
    table, bad = spark_rows.to_table(DATA, [f"m{s}" for s in seqs], [{"seq": s} for s in seqs])
    assert table is not None and not bad
    name = f"{BP.decode()}-{ref}.parquet"
    jobs.staging.write(table, name)
    h = Handed(BP, ref, len(table), "size", at, name, spark_rows.schema_to_ipc(table.schema))
    jobs.groups.add(h)
    return h


def run(jobs: CommitterJobs) -> tuple[Job, list[tuple[int, str | None]]]:
    """One group commit, as the stage runs it: plan in the loop, commit in the helper
    thread (here: the same thread), finish in the loop; the answers as (ref, error)."""
    assert jobs.groups.ready(now=0.0)
    job = jobs.plan()
    assert jobs.running is job
    try:
        jobs.commit(job)
    except BaseException as exc:   # what the stage's thread hands back
        job.raised = exc
    done = jobs.finish(job)
    assert done is not None and jobs.running is None
    return job, [(a.ref, a.error) for a in done.answers]


def test_a_group_is_one_job_journaled_before_it_runs_and_every_batch_answered(
        tmp_path: Path) -> None:
    spark = FakeSpark()
    jobs = committer(tmp_path, spark)
    hand(jobs, 1, range(0, 60))
    assert not jobs.groups.ready(now=0.0)        # 60 of 100 rows, not yet due
    hand(jobs, 2, range(60, 120))
    _, answers = run(jobs)
    assert answers == [(1, None), (2, None)]
    # one job, reading the group's two staged files merged into one (Spark's cost per file)
    assert len(spark.commits) == 1 and len(spark.commits[0][1]) == 1
    assert spark.commits[0][1][0].rsplit("/", 1)[1].startswith(MERGED_PREFIX)
    stamp = spark.commits[0][0]
    assert jobs.journal is not None and jobs.journal.last() == [stamp]   # journaled
    assert sorted(s for _, s, _ in spark.rows) == list(range(120))
    assert jobs.counters["commits"] == 1 and jobs.counters["out"] == 120
    # the committed files stay while their batch processor may restart (their ids would
    # be in doubt then); nothing else is left staged
    assert jobs.recent.names() == {f"{BP.decode()}-1.parquet", f"{BP.decode()}-2.parquet"}
    assert jobs.staging is not None
    assert sorted(jobs.staging.names()) == sorted(jobs.recent.names())   # the merge gone


def test_a_group_that_cannot_be_merged_is_committed_from_its_files(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The merged file cannot be written (here: a directory stands at its name; a full
    staging disk does the same): Spark reads the group's own files, the stamp in the
    plan, and every row is written once."""
    spark = FakeSpark()
    jobs = committer(tmp_path, spark)
    assert jobs.staging is not None
    (Path(jobs.staging.path) / f"{MERGED_PREFIX}committer_default-1.parquet").mkdir()
    hand(jobs, 1, range(0, 60))
    hand(jobs, 2, range(60, 120))
    with caplog.at_level(logging.INFO, logger="offbroadway.committer"):
        _, answers = run(jobs)
    assert answers == [(1, None), (2, None)]
    assert len(spark.commits) == 1 and [f.rsplit("/", 1)[1] for f in spark.commits[0][1]] \
        == [f"{BP.decode()}-1.parquet", f"{BP.decode()}-2.parquet"]
    assert sorted(s for _, s, _ in spark.rows) == list(range(120))
    assert "could not be merged" in caplog.text


def test_a_stale_copy_and_its_redelivery_in_one_group_are_written_once(
        tmp_path: Path) -> None:
    """A lost broker connection: the stale copies of messages 40-59 (first deliveries,
    unmarked) and their redelivered copies (marked) meet in one group, before either is
    in the dataset, and no restart started a watch: each message is written once."""
    spark = FakeSpark()
    jobs = committer(tmp_path, spark)
    assert not jobs.doubt.active()
    hand(jobs, 1, range(0, 60))
    assert jobs.staging is not None
    again = range(40, 60)
    table, _ = spark_rows.to_table(DATA, [f"m{s}" for s in again], [{"seq": s} for s in again])
    assert table is not None
    name = staged_name(BP.decode(), 2, again=True)
    jobs.staging.write(table, name, again=[f"m{s}" for s in again])
    jobs.groups.add(Handed(BP, 2, len(table), "size", 0.0, name,
                           spark_rows.schema_to_ipc(table.schema)))
    hand(jobs, 3, range(60, 100))
    _, answers = run(jobs)
    assert sorted(answers) == [(1, None), (2, None), (3, None)]
    assert sorted(s for _, s, _ in spark.rows) == list(range(100))


def test_a_restart_puts_the_job_in_doubt_and_does_not_write_its_rows_again(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An incarnation journals its stamp, Spark commits the job, and the committer dies
    before it answers: the batch processors' messages come back.  The next incarnation
    settles the dead one's session, reads the stamp's rows back, and acknowledges the
    redelivered rows without writing them again; the new rows are written."""
    spark = FakeSpark()
    first = committer(tmp_path, spark)
    hand(first, 1, range(0, 100))
    job = first.plan()
    first.commit(job)                 # Spark committed ... and the committer died here
    (stamp, _), = spark.commits
    session = first.journal.sessions()[-1] if first.journal is not None else None

    with caplog.at_level(logging.INFO, logger="offbroadway.committer"):
        again = committer(tmp_path, spark)   # the next incarnation, same journal, Spark
    assert spark.settled == [session]     # the dead incarnation's jobs are over first
    assert "an earlier incarnation's Spark session settled" in caplog.text
    assert len(again.doubt) == 100 and again.doubt.watching
    hand(again, 7, range(50, 150))        # 50 redelivered, 50 new
    job, answers = run(again)
    assert answers == [(7, None)]          # acknowledged: its rows are all in the dataset
    assert job.left_out == {id(job.items[0]): 50}
    assert again.counters["already_written"] == 50 and again.counters["out"] == 50
    seqs = Counter(s for _, s, _ in spark.rows)
    assert sorted(seqs) == list(range(150)) and set(seqs.values()) == {1}   # each once
    assert again.journal is not None and again.journal.last()[0] == stamp


def test_after_a_run_marked_clean_nothing_is_in_doubt_and_a_later_commit_unmarks_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A run whose every committed row was acknowledged at its source ends with the
    journal marked clean (the daemon does it): the next incarnation reads nothing back and
    puts nothing in doubt.  A commit after the mark ends the clean state again."""
    spark = FakeSpark()
    first = committer(tmp_path, spark)
    hand(first, 1, range(0, 100))
    run(first)
    assert first.journal is not None
    first.journal.mark_clean()
    assert first.journal.ended_clean() and len(first.journal.last()) == 1

    with caplog.at_level(logging.INFO, logger="offbroadway.committer"):
        again = committer(tmp_path, spark)
    assert len(again.doubt) == 0 and not again.doubt.watching
    assert "settled" not in caplog.text   # a clean stop released its session: no line
    hand(again, 2, range(100, 200))
    run(again)
    assert again.journal is not None and not again.journal.ended_clean()

    third = committer(tmp_path, spark)    # the second run was not marked: in doubt again
    assert len(third.doubt) == 200 and third.doubt.watching


def test_a_failed_write_fails_its_batches_alone_and_keeps_nothing_staged(
        tmp_path: Path) -> None:
    spark = FakeSpark()
    jobs = committer(tmp_path, spark)
    reason = "spark: write failed after 3 attempt(s) over 60 s (retry bound 60 s): UNAVAILABLE"
    spark.fail = CommitFailed(reason)
    hand(jobs, 1, range(0, 50))
    hand(jobs, 2, range(50, 100))
    _, answers = run(jobs)
    assert answers == [(1, reason), (2, reason)]   # retried already: the group fails
    assert len(spark.commits) == 1 and not spark.rows
    assert jobs.counters["commit_failures"] == 1 and jobs.counters["failed"] == 100
    assert jobs.counters["out"] == 0
    assert jobs.staging is not None and jobs.staging.names() == []   # failed: removed
    # Spark rejects a group outright (an analysis error): one job per batch, so only the
    # culprit fails
    spark.fail = CommitFailed("spark: Spark rejected the batch: AnalysisException",
                              permanent=True)
    hand(jobs, 3, range(100, 150))
    hand(jobs, 4, range(150, 200))
    _, answers = run(jobs)
    assert [e for _, e in answers] == ["spark: Spark rejected the batch: AnalysisException"] * 2
    assert len(spark.commits) == 1 + 3   # the group, then each batch alone


@pytest.mark.parametrize("once", [True, False])
def test_without_exactly_once_nothing_is_journaled_nor_kept(tmp_path: Path, once: bool) -> None:
    spark = FakeSpark()
    jobs = CommitterJobs(CommitterSpark(commit_rows=10, exactly_once=once),
                         writer="committer_default", batcher="default", counters=Counter(),
                         journal=Journal(str(tmp_path / "j" / "t.default")), sink=spark,
                         staging=StagingDir(str(tmp_path / "staging")))
    assert (jobs.new_session() is None) is (not once)
    job = jobs.schema_job()
    jobs.prepare(job)
    jobs.finish(job)
    hand(jobs, 1, range(10))
    _, answers = run(jobs)
    assert answers == [(1, None)]
    assert bool(jobs.recent.names()) is once
    assert (jobs.journal is not None and bool(jobs.journal.last())) is once


def test_the_stage_answers_hello_and_a_flushed_batch_through_its_sockets(
        tmp_path: Path) -> None:
    """The whole committer stage, its sockets fake (:class:`FakeIO`) and Spark too: the
    helper thread runs each job, the done pipe hands it back to the loop."""
    from offbroadway.stages.roles.committer import CommitterStage
    from offbroadway.stages.runtime.spec import StageSpec
    from offbroadway.stages.wire import protocol as P

    from tests.stages.fakes import FakeIO

    def job_done(stage: CommitterStage) -> None:
        assert stage._thread is not None
        stage._thread.join(timeout=30)
        stage._on_job_done()

    spark = FakeSpark()
    spec = StageSpec("committer_default", "committer", "t", str(tmp_path), batcher="default",
                     state_dir=str(tmp_path / "state"),
                     spark=CommitterSpark(sink=SinkSettings(output=str(tmp_path / "out"))))
    io = FakeIO()
    stage = CommitterStage(spec, io, sink=spark)
    stage.setup()
    router = io.router_sock
    assert router is not None
    router.push(BP, P.hello())
    stage._on_frames(router)
    assert router.take() == []                 # the schema job still runs: hello waits
    job_done(stage)
    (peer, answer), = router.take()
    assert peer == BP and answer[P.KIND_AT] == P.SCHEMA and answer[P.SCHEMA_IPC] is None
    staging = StagingDir(answer[P.SCHEMA_STAGING])
    table, _ = spark_rows.to_table(DATA, ["a", "b"], [{"seq": 1}, {"seq": 2}])
    assert table is not None
    staging.write(table, f"{BP.decode()}-5.parquet")
    router.push(BP, P.commit(5, "flush", 2, f"{BP.decode()}-5.parquet",
                             spark_rows.schema_to_ipc(table.schema)))
    stage._on_frames(router)                   # flushed: a job starts at once
    assert stage.stats()["committing"] == 2
    job_done(stage)
    (peer, answer), = router.take()
    assert peer == BP and answer[P.KIND_AT] == P.RESULT
    assert (answer[P.RESULT_REF], answer[P.RESULT_ERROR]) == (5, None)
    assert sorted(s for _, s, _ in spark.rows) == [1, 2]
    assert stage.counters["commits"] == 1 and stage.stats()["last_commit"]["rows"] == 2
    stage.teardown()
