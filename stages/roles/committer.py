"""The committer stage: one per Spark batcher key, the only writer of that key's dataset.

Batch processors stage their batches as Parquet files (:mod:`.spark_staging`) and hand
it the names (:mod:`.protocol`'s Spark hand-off); it groups the files of all of them into
one Spark job when enough rows or enough time gathered (:mod:`.spark_commit`, the pure
rule): Spark reads the group with its vectorised reader and appends it to the dataset,
and the committer answers each batch once the job holding it committed (or failed).  The batch
processor acks a batch only on that answer.  The committer never touches the dataset
itself (only Spark writes there); it removes staged files once their job is over.

Why a process of its own (docs/design-spark.md §4): a Spark job costs ~100-270 ms
whatever its size, so the batches of *all* batch processors of a batcher must share jobs,
and one writer per dataset also serializes its commits.  In the batcher it would sit
before ``handle_batch`` (the rows Spark gets are what ``handle_batch`` returns); in the
Spark server it would not exist for a ``remote`` cluster.

The Spark work (DDL parse, commits with their retries) runs in one helper thread, one
job at a time; the stage loop keeps receiving batches, heartbeating and reporting while
a job runs, and a pipe tells it when the job is over.  A job that fails fails only its
own batches; a job Spark rejects outright is split and its batches committed one by one,
so only the batch that caused it fails.  Told to stop while a job is being retried, the
committer abandons it and answers nothing: those batches stay unacked.

This module is the stage's shell: the sockets, the helper thread, the reachability
probe, ``status``.  What to commit, when, what is in doubt and what a failed write means
is :mod:`.committer_jobs` (pure, synchronous), which the shell hands the Spark sink and
the journal through its seam.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import msgspec
import pyarrow as pa
import zmq

from ..runtime.spec import JOURNAL_FOLDER, CommitterSpark, StageSpec, journal_file
from ..runtime.stage import Stage, StageExit, ZmqIO
from ..spark.spark_commit import Handed
from ..spark.spark_failures import WriteAbandoned
from ..spark.spark_once import Journal
from ..spark.spark_staging import StagingDir, default_root
from ..wire import commands, protocol
from .committer_jobs import CommitterJobs, Job, SparkPort

log = logging.getLogger("offbroadway.committer")

#: a Spark call running longer than this makes the committer check whether Spark can be
#: reached at all (SparkSink.probe), once a second while it runs
PROBE_AFTER = 2.0



@dataclass(frozen=True)
class LastCommit:
    """The last job that wrote rows: when it ended (epoch seconds), its rows, its seconds."""

    at: float
    rows: int
    seconds: float


@dataclass(frozen=True)
class Unreachable:
    """Spark found unreachable: since when (epoch seconds), and the probe's reason."""

    since: float
    why: str

class CommitterStage(Stage):
    """``io``: its sockets (:class:`ZmqIO`); ``sink``: its Spark side (:class:`SparkPort`),
    else the :class:`~offbroadway.stages.spark.spark_sink.SparkSink` its settings describe,
    made in :meth:`setup`.  A unit test gives fakes of both."""

    def __init__(self, spec: StageSpec, io: ZmqIO | None = None,
                 sink: SparkPort | None = None) -> None:
        super().__init__(spec, io)
        self._given_sink = sink
        settings = spec.spark
        if not isinstance(settings, CommitterSpark):
            raise TypeError(f"a committer's spec carries its CommitterSpark, not {settings!r}")
        # where the daemon said (daemon/spark.py: under its state dir by default); the
        # sink's dataset lock lives there too
        root = settings.sink.staging or default_root(spec.state_dir or spec.runtime_dir)
        self.sink_settings = msgspec.structs.replace(settings.sink, staging=root)
        self.staging_root = root.rstrip("/") + "/" + spec.batcher
        journals = settings.journal or os.path.join(spec.state_dir or spec.runtime_dir,
                                                    JOURNAL_FOLDER)
        journal = Journal(journal_file(journals, spec.pipeline, spec.batcher)) \
            if settings.exactly_once else None
        self.counters.update(batches=0, commits=0, commit_failures=0, already_written=0,
                             looked_up=0)
        self.jobs = CommitterJobs(settings, writer=self.id, batcher=spec.batcher,
                                  counters=self.counters, journal=journal)
        self.groups = self.jobs.groups
        self.accept(commands.Redelivery, self._on_redelivery)
        self.waiting_hello: set[bytes] = set()
        #: the helper thread running :attr:`jobs`' running job (None: none)
        self._thread: threading.Thread | None = None
        self._timer_at: float | None = None
        #: the last job that wrote rows (``status`` shows it)
        self._last_commit: LastCommit | None = None
        #: Spark found unreachable: since when and why; see _watch_spark
        self._down: Unreachable | None = None
        self._probing = False

    @property
    def sink(self) -> Any:
        return self.jobs.sink

    # -- wiring --------------------------------------------------------------------------
    def setup(self) -> None:
        session = self.jobs.new_session()
        if self._given_sink is not None:
            self.jobs.sink = self._given_sink
        else:
            from ..spark.spark_sink import SparkSink  # pyspark only in this stage

            s = self.sink_settings
            self.jobs.sink = SparkSink(
                remote=s.remote, output=s.output, format=s.format,
                partition_by=s.partition_by, schema=s.schema, token_env=s.token_env,
                token_file=s.token_file, write_retry_seconds=s.write_retry_seconds,
                write_timeout=s.write_timeout, staging=s.staging, table=s.table,
                evolve=s.evolve, use_ssl=s.use_ssl, ca_file=s.ca_file,
                connect_timeout=s.connect_timeout, writer_id=self.id,
                should_stop=lambda: not self.running, session_id=session)
        self.jobs.staging = staging = StagingDir(self.staging_root)
        # every batch processor of this batcher restarts after us (rest_for_one): what
        # is staged now belongs to incarnations that are gone (and a Spark job still
        # reading it fails rather than commit rows nobody acknowledges)
        swept = staging.sweep()   # (the journal puts their last commits in doubt)
        if swept:
            log.info("%s: removed %d staged file(s) of earlier incarnations", self.id, swept)
        self.sock = self.router()
        self.register(self.sock, self._on_frames)
        self._done_r, self._done_w = os.pipe()
        os.set_blocking(self._done_r, False)
        self.register_fd(self._done_r, self._on_job_done)
        job = self.jobs.schema_job()
        self._start(job, lambda: self.jobs.prepare(job))
        self.call_later(1.0, self._watch_spark)

    def _watch_spark(self) -> None:
        """Once a second: while a Spark call has run for more than :data:`PROBE_AFTER`,
        check in a thread of its own whether Spark can be reached at all.  A partition
        leaves the job's call hanging without an error for as long as TCP retries, so
        only a probe tells an operator that Spark is unreachable, and since when
        (``status``: ``spark_unreachable_since``), rather than a job that is just long."""
        self.call_later(1.0, self._watch_spark)
        job = self.jobs.running
        if job is None or self._probing or self.sink is None or \
                time.monotonic() - job.started < PROBE_AFTER:
            return
        self._probing = True
        threading.Thread(target=self._probe, name="spark-probe", daemon=True).start()

    def _probe(self) -> None:
        at = time.time()
        try:
            why = self.sink.probe(self.sink.connect_timeout)
        except Exception as exc:   # a probe must never take the stage down
            why = f"{type(exc).__name__}: {exc}"
        finally:
            self._probing = False
        self._reachable(why, at)

    def _reachable(self, why: str | None, at: float) -> None:
        """What the last probe (or a job that wrote) found; logged when it changes."""
        down = self._down
        if why is None:
            if down is not None:
                log.info("%s: Spark reachable again (unreachable for %.0f s)", self.id,
                         time.time() - down.since)
            self._down = None
        elif down is None:
            self._down = Unreachable(at, why)
            log.warning("%s: Spark unreachable (%s); the job waits, and so does the source",
                        self.id, why)
        else:
            self._down = Unreachable(down.since, why)

    def teardown(self) -> None:
        # A job still running is waited for (heartbeating): left alone it would become a
        # job nobody tracks; its retries end at once since should_stop() is true now.
        if self._thread is not None:
            from offbroadway.supervision import child

            while self._thread.is_alive():
                child.heartbeat()
                self._thread.join(timeout=1.0)
            try:
                self._finish_job()
            except StageExit:
                pass
        if self.sink is not None:
            self.sink.close()

    def stats(self) -> dict[str, Any]:
        last = self._last_commit
        job = self.jobs.running
        return {**super().stats(), "waiting_batches": len(self.groups),
                "waiting_rows": self.groups.waiting_rows,
                "committing": sum(h.rows for h in job.items) if job is not None else 0,
                "spark_unreachable_since": None if self._down is None else self._down.since,
                "spark_unreachable": None if self._down is None else self._down.why,
                "last_commit": None if last is None else
                {"at": last.at, "rows": last.rows, "seconds": last.seconds}}

    # -- frames from batch processors ------------------------------------------------------
    def _on_frames(self, sock: zmq.Socket) -> None:
        for _ in range(100):
            try:
                peer, frame = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            except ValueError:   # not two parts: not one of ours
                self.counters["malformed"] += 1
                continue
            try:
                msg = protocol.decode(frame)
                if msg[protocol.KIND_AT] == protocol.HELLO:
                    self._on_hello(peer)
                elif msg[protocol.KIND_AT] == protocol.DRAINED:
                    self.groups.drain(peer)
                elif msg[protocol.KIND_AT] == protocol.COMMIT:
                    name, rows = msg[protocol.COMMIT_FILE], msg[protocol.COMMIT_ROWS]
                    if "/" in name or name.startswith("."):
                        raise ValueError(f"not a staged file name: {name!r}")
                    self.groups.add(Handed(peer, msg[protocol.COMMIT_REF], rows,
                                           msg[protocol.COMMIT_TRIGGER], time.monotonic(),
                                           name, msg[protocol.COMMIT_SCHEMA]))
                    self.counters["in"] += rows
                    self.counters["batches"] += 1
                else:
                    raise protocol.ProtocolError(
                        f"{protocol.KIND_NAMES[msg[protocol.KIND_AT]]} is not for a committer")
            except (pa.ArrowException, TypeError, ValueError) as exc:   # ProtocolError too
                self.counters["malformed"] += 1
                log.warning("%s: dropped a malformed frame from %r: %s", self.id, peer, exc)
        self._maybe_start()

    def _on_hello(self, peer: bytes) -> None:
        self.jobs.hello(peer)
        if self.jobs.schema_known:
            self._send(peer, self._schema_frame())
        else:
            self.waiting_hello.add(peer)

    def _on_redelivery(self, command: commands.Redelivery) -> None:
        """The daemon says the sources take back what was in flight (a producer restarts,
        or the live ones requeue what a crash lost): :meth:`.CommitterJobs.redelivery`."""
        self.jobs.redelivery(command.reason)

    def _schema_frame(self) -> bytes:
        assert self.jobs.staging is not None
        return protocol.schema(self.jobs.schema_ipc(), self.jobs.schema_error,
                               self.jobs.staging.uri)

    def _send(self, peer: bytes, frame: bytes) -> None:
        try:
            self.sock.send_multipart([peer, frame], zmq.NOBLOCK)
        except zmq.ZMQError:   # the batch processor is gone; its batches are redelivered
            pass

    # -- jobs ----------------------------------------------------------------------------
    def _maybe_start(self) -> None:
        if self._thread is not None or not self.jobs.schema_known or not self.running:
            return
        now = time.monotonic()
        if not self.groups.ready(now):
            due = self.groups.due_at()
            if due is not None and self._timer_at != due:
                self._timer_at = due
                self.call_at(due, self._maybe_start)
            return
        job = self.jobs.plan()
        self._start(job, lambda: self.jobs.commit(job))
        self._report_now()

    def _start(self, job: Job, fn: Callable[[], None]) -> None:
        """``fn`` runs ``job`` in the helper thread; the done pipe tells the loop."""
        job.started = time.monotonic()

        def run() -> None:
            try:
                fn()
            except BaseException as exc:   # handed to the loop, which decides
                job.raised = exc
            finally:
                os.write(self._done_w, b"x")

        self._thread = threading.Thread(target=run, name=f"spark-{job.kind}", daemon=True)
        self._thread.start()

    def _report_now(self) -> None:
        """``status`` shows a job from the moment it starts to the moment it ends, not up
        to a tick later (operators read ``committing`` there, and so do the tests that kill
        a stage during a commit): one report more per job, about one a second."""
        try:
            self.report(commands.Stats(self.stats()))
        except zmq.Again:
            pass

    def _on_job_done(self) -> None:
        try:
            os.read(self._done_r, 64)
        except BlockingIOError:
            return
        if self._thread is None:
            return
        self._finish_job()   # the byte is the job's last act: join() returns at once
        self._maybe_start()

    def _finish_job(self) -> None:
        assert self._thread is not None and self.jobs.running is not None
        self._thread.join()
        job = self.jobs.running
        self._thread = None
        took = time.monotonic() - job.started
        try:
            done = self.jobs.finish(job)
        except WriteAbandoned:
            log.warning("%s: stopping; %d batch(es) left unacked (Spark write abandoned "
                        "between retries)", self.id, len(job.items))
            raise StageExit from None
        if done is None:   # the schema job: the batch processors that said hello wait
            frame = self._schema_frame()
            for peer in self.waiting_hello:
                self._send(peer, frame)
            self.waiting_hello.clear()
            return
        schema_ipc = self.jobs.schema_ipc()
        if done.rows:
            self._reachable(None, time.time())   # it wrote: Spark answers
            self._last_commit = LastCommit(time.time(), done.rows, took)
            self.metrics.observe("spark_write", took, self.spec.batcher)
            self.metrics.observe("spark_commit_rows", done.rows, self.spec.batcher)
        # the books before the answers: the daemon's count of rows written must not trail
        # the acks those answers bring about
        self._report_now()
        for a in done.answers:
            self._send(a.peer, protocol.result(a.ref, a.error, schema_ipc))
