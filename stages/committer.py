"""The committer stage: one per Spark batcher key, the only writer of that key's dataset.

Batch processors hand it their batches as Arrow tables (:mod:`.spark_wire`); it groups
the batches of all of them into one Spark job when enough rows or enough time gathered
(:mod:`.spark_commit`, the pure rule) and answers each batch once the job holding it
committed (or failed).  The batch processor acks a batch only on that answer.

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
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import pyarrow as pa
import zmq

from . import commands, spark_rows, spark_wire
from .spark_commit import DEFAULT_INTERVAL, DEFAULT_ROWS, CommitGroups, Handed
from .spec import StageSpec
from .stage import Stage, StageExit

log = logging.getLogger("offbroadway.committer")

#: settings in the spec's ``spark`` dict that are the committer's, not the sink's
GROUP_KEYS = ("commit_rows", "commit_interval")


class CommitterStage(Stage):
    def __init__(self, spec: StageSpec) -> None:
        super().__init__(spec)
        settings = dict(spec.spark or {})
        self.groups = CommitGroups(
            rows=int(settings.pop("commit_rows", None) or DEFAULT_ROWS),
            interval=float(settings.pop("commit_interval", None) or DEFAULT_INTERVAL))
        self.sink_settings = settings
        self.sink: Any = None
        self.counters.update(batches=0, commits=0, commit_failures=0)
        self.schema: pa.Schema | None = None          # the dataset's data columns
        self.schema_error: str | None = None
        self.schema_known = not settings.get("schema")
        self.waiting_hello: set[bytes] = set()
        self._job: threading.Thread | None = None
        self._job_items: list[Handed] = []
        self._job_kind = ""
        self._job_out: dict[str, Any] = {}
        self._job_started = 0.0
        self._timer_at: float | None = None
        #: the last job that wrote rows: (epoch seconds it ended, rows, seconds it took)
        self._last_commit: tuple[float, int, float] | None = None

    # -- wiring --------------------------------------------------------------------------
    def setup(self) -> None:
        from .spark_sink import SparkSink  # pyspark only in this stage

        self.sink = SparkSink(**self.sink_settings, writer_id=self.id,
                              should_stop=lambda: not self.running)
        self.sock = self.router()
        self.register(self.sock, self._on_frames)
        self._done_r, self._done_w = os.pipe()
        os.set_blocking(self._done_r, False)
        self.register_fd(self._done_r, self._on_job_done)
        if not self.schema_known:
            self._start("schema", [], self._parse_schema)

    def teardown(self) -> None:
        # A job still running is waited for (heartbeating): left alone it would become a
        # job nobody tracks; its retries end at once since should_stop() is true now.
        if self._job is not None:
            from offbroadway.supervision import child

            while self._job.is_alive():
                child.heartbeat()
                self._job.join(timeout=1.0)
            try:
                self._finish_job()
            except StageExit:
                pass
        if self.sink is not None:
            self.sink.close()

    def stats(self) -> dict[str, Any]:
        last = self._last_commit
        return {**super().stats(), "waiting_batches": len(self.groups),
                "waiting_rows": self.groups.waiting_rows,
                "committing": sum(h.rows for h in self._job_items),
                "last_commit": None if last is None else
                {"at": last[0], "rows": last[1], "seconds": last[2]}}

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
                msg = spark_wire.decode(frame)
                if msg[0] == spark_wire.HELLO:
                    self._on_hello(peer)
                elif msg[0] == spark_wire.COMMIT:
                    ref, trigger, _rows, data = msg[1:]
                    table = spark_rows.from_ipc(data)
                    self.groups.add(Handed(peer, int(ref), len(table), str(trigger),
                                           time.monotonic(), table))
                    self.counters["in"] += len(table)
                    self.counters["batches"] += 1
            except (spark_wire.WireError, pa.ArrowException, TypeError, ValueError) as exc:
                self.counters["malformed"] += 1
                log.warning("%s: dropped a malformed frame from %r: %s", self.id, peer, exc)
        self._maybe_start()

    def _on_hello(self, peer: bytes) -> None:
        gone = self.groups.drop_peer(peer)
        if gone:
            log.info("%s: %s restarted; %d of its batches not yet in a job dropped (they "
                     "are delivered again)", self.id, peer.decode(errors="replace"), len(gone))
        if self.schema_known:
            self._send(peer, spark_wire.schema(self._schema_ipc(), self.schema_error))
        else:
            self.waiting_hello.add(peer)

    def _send(self, peer: bytes, frame: bytes) -> None:
        try:
            self.sock.send_multipart([peer, frame], zmq.NOBLOCK)
        except zmq.ZMQError:   # the batch processor is gone; its batches are redelivered
            pass

    def _schema_ipc(self) -> bytes | None:
        return spark_rows.schema_to_ipc(self.schema) if self.schema is not None else None

    # -- jobs ----------------------------------------------------------------------------
    def _maybe_start(self) -> None:
        if self._job is not None or not self.schema_known or not self.running:
            return
        now = time.monotonic()
        if not self.groups.ready(now):
            due = self.groups.due_at()
            if due is not None and self._timer_at != due:
                self._timer_at = due
                self.call_at(due, self._maybe_start)
            return
        items = self.groups.take()
        tables = []
        for h in items:
            try:
                tables.append(self._conform(h.table))
            except ValueError as exc:   # this batch alone does not fit the dataset
                h.table = None
                self._job_out.setdefault("errors", {})[id(h)] = \
                    f"spark: the batch does not fit the dataset's schema: {exc}"
        job = [h for h in items if h.table is not None]
        for h, t in zip(job, tables):
            h.table = t
        self._start("commit", items, lambda: self._commit(job))
        self._report_now()

    def _conform(self, table: pa.Table) -> pa.Table:
        if self.schema is None:   # the first table fixes the dataset's schema
            self.schema = pa.schema([f for f in table.schema if f.name != "message_id"])
        full = self.schema.append(spark_rows.ID_FIELD)
        return spark_rows.conform(table, full)

    def _start(self, kind: str, items: list[Handed], fn: Any) -> None:
        out = self._job_out
        out.setdefault("errors", {})
        self._job_kind = kind
        self._job_items = items
        self._job_started = time.monotonic()

        def run() -> None:
            try:
                fn()
            except BaseException as exc:   # handed to the loop, which decides
                out["raised"] = exc
            finally:
                os.write(self._done_w, b"x")

        self._job = threading.Thread(target=run, name=f"spark-{kind}", daemon=True)
        self._job.start()

    def _report_now(self) -> None:
        """``status`` shows a job from the moment it starts to the moment it ends, not up
        to a tick later (operators read ``committing`` there, and so do the tests that kill
        a stage during a commit): one report more per job, about one a second."""
        try:
            self.report(commands.Stats(self.stats()))
        except zmq.Again:
            pass

    def _parse_schema(self) -> None:
        from .spark_sink import CommitFailed

        try:
            self._job_out["schema"] = self.sink.data_schema()
        except CommitFailed as exc:
            self._job_out["schema_error"] = exc.reason

    def _commit(self, job: list[Handed]) -> None:
        """In the helper thread: one Spark job for the whole group; if Spark rejects it
        outright, one job per batch so that only the culprit fails."""
        from .spark_sink import CommitFailed

        errors: dict[int, str] = self._job_out["errors"]
        if not job:
            return
        try:
            # one chunk: Spark handles a table of many 2,000-row record batches at about
            # half the speed of the same rows in one (measured with 50k-row jobs: 15-24k
            # against 31-37k rows/s); the copy costs the committer ~1 ms per 50k rows
            self.sink.commit(self.spec.batcher,
                             pa.concat_tables([h.table for h in job]).combine_chunks())
            return
        except CommitFailed as exc:
            if not exc.permanent or len(job) == 1:
                for h in job:
                    errors[id(h)] = exc.reason
                return
        for h in job:
            try:
                self.sink.commit(self.spec.batcher, h.table)
            except CommitFailed as exc:
                errors[id(h)] = exc.reason

    def _on_job_done(self) -> None:
        try:
            os.read(self._done_r, 64)
        except BlockingIOError:
            return
        if self._job is None:
            return
        self._finish_job()   # the byte is the job's last act: join() returns at once
        self._maybe_start()

    def _finish_job(self) -> None:
        from .spark_sink import WriteAbandoned

        assert self._job is not None
        self._job.join()
        out, items, kind = self._job_out, self._job_items, self._job_kind
        self._job, self._job_items, self._job_out = None, [], {}
        took = time.monotonic() - self._job_started
        raised = out.get("raised")
        if isinstance(raised, WriteAbandoned):
            log.warning("%s: stopping; %d batch(es) left unacked (Spark write abandoned "
                        "between retries)", self.id, len(items))
            raise StageExit from None
        if raised is not None:
            raise raised   # a bug: let the supervisor see it
        if kind == "schema":
            self.schema_known = True
            if "schema" in out:
                self.schema = out["schema"]
            self.schema_error = out.get("schema_error")
            frame = spark_wire.schema(self._schema_ipc(), self.schema_error)
            for peer in self.waiting_hello:
                self._send(peer, frame)
            self.waiting_hello.clear()
            return
        errors: dict[int, str] = out["errors"]
        schema_ipc = self._schema_ipc()
        rows = sum(h.rows for h in items if id(h) not in errors)
        if rows:
            self.counters["commits"] += 1
            self.counters["out"] += rows
            self._last_commit = (time.time(), rows, took)
            self.metrics.observe("spark_write", took, self.spec.batcher)
            self.metrics.observe("spark_commit_rows", rows, self.spec.batcher)
        if errors:
            self.counters["commit_failures"] += 1
            self.counters["failed"] += sum(h.rows for h in items if id(h) in errors)
        for h in items:
            self._send(h.peer, spark_wire.result(h.ref, errors.get(id(h)), schema_ipc))
        self._report_now()
