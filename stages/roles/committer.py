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
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import zmq

from ..runtime.spec import StageSpec
from ..runtime.stage import Stage, StageExit
from ..spark import spark_rows
from ..spark.spark_commit import DEFAULT_INTERVAL, DEFAULT_ROWS, CommitGroups, Handed
from ..spark.spark_once import PEER_BATCHES, RECOVER, WATCH, Doubt, Journal, RecentFiles
from ..spark.spark_staging import StagingDir, default_root
from ..wire import commands, protocol

log = logging.getLogger("offbroadway.committer")

#: a Spark call running longer than this makes the committer check whether Spark can be
#: reached at all (SparkSink.probe), once a second while it runs
PROBE_AFTER = 2.0

#: settings in the spec's ``spark`` dict that are the committer's, not the sink's
GROUP_KEYS = ("commit_rows", "commit_interval", "exactly_once", "peer_batches")


class CommitterStage(Stage):
    def __init__(self, spec: StageSpec) -> None:
        super().__init__(spec)
        settings = dict(spec.spark or {})
        self.groups = CommitGroups(
            rows=int(settings.pop("commit_rows", None) or DEFAULT_ROWS),
            interval=float(settings.pop("commit_interval", None) or DEFAULT_INTERVAL))
        # where the daemon said (daemon/spark.py: under its state dir by default)
        root = settings.get("staging") or default_root(spec.state_dir or spec.runtime_dir)
        settings["staging"] = root   # the sink's dataset lock lives there too
        self.staging_root = root.rstrip("/") + "/" + spec.batcher
        journals = settings.pop("journal", None) or os.path.join(
            spec.state_dir or spec.runtime_dir, "spark-commits")
        #: ``[spark] exactly_once = false``: no journal of commit stamps, no ids in doubt
        #: (a restart may write again what its last commits held: at-least-once)
        self.once = bool(settings.pop("exactly_once", True))
        self.journal = Journal(os.path.join(journals, f"{spec.pipeline}.{spec.batcher}")) \
            if self.once else None
        self.doubt = Doubt()
        # a batch processor's answered batches not yet acked are at most its demand (the
        # topology's, given here): all of their files are kept (at least PEER_BATCHES)
        self.recent = RecentFiles(max(PEER_BATCHES,
                                      int(settings.pop("peer_batches", None) or 0)))
        #: batch processors seen saying hello (a second hello: a new incarnation)
        self._seen: set[bytes] = set()
        #: a batch processor restarted while a job ran: its batches are all in doubt
        self._restarted = False
        self.sink_settings = settings
        self.staging: StagingDir | None = None
        self.sink: Any = None
        self.counters.update(batches=0, commits=0, commit_failures=0, already_written=0,
                             looked_up=0)
        self.accept(commands.Redelivery, self._on_redelivery)
        self.schema: pa.Schema | None = None          # the dataset's data columns
        self._schema_bytes: bytes | None = None        # with message_id, as IPC
        self.schema_error: str | None = None
        #: the dataset's schema is known (no DDL to parse) and the ids in doubt after an
        #: earlier incarnation are loaded: commits may start
        self.schema_known = False
        self.waiting_hello: set[bytes] = set()
        self._job: threading.Thread | None = None
        self._job_items: list[Handed] = []
        self._job_kind = ""
        self._job_out: dict[str, Any] = {}
        self._job_started = 0.0
        self._timer_at: float | None = None
        #: the last job that wrote rows: (epoch seconds it ended, rows, seconds it took)
        self._last_commit: tuple[float, int, float] | None = None
        #: Spark found unreachable: (epoch seconds since, why); see _watch_spark
        self._down: tuple[float, str] | None = None
        self._probing = False
        self._earlier_sessions: list[str] = []

    # -- wiring --------------------------------------------------------------------------
    def setup(self) -> None:
        from ..spark.spark_sink import SparkSink  # pyspark only in this stage

        self.sink = SparkSink(**self.sink_settings, writer_id=self.id,
                              should_stop=lambda: not self.running,
                              session_id=self._new_session())
        self.staging = StagingDir(self.staging_root)
        # every batch processor of this batcher restarts after us (rest_for_one): what
        # is staged now belongs to incarnations that are gone (and a Spark job still
        # reading it fails rather than commit rows nobody acknowledges)
        swept = self.staging.sweep()   # (the journal puts their last commits in doubt)
        if swept:
            log.info("%s: removed %d staged file(s) of earlier incarnations", self.id, swept)
        self.sock = self.router()
        self.register(self.sock, self._on_frames)
        self._done_r, self._done_w = os.pipe()
        os.set_blocking(self._done_r, False)
        self.register_fd(self._done_r, self._on_job_done)
        self._start("schema", [], self._prepare)
        self.call_later(1.0, self._watch_spark)

    def _new_session(self) -> str | None:
        """This incarnation's Spark Connect session id, journaled before its first call;
        the earlier incarnations' still there are settled before the first commit
        (:meth:`_settle_sessions`).  None without exactly once."""
        if self.journal is None:
            return None
        self._earlier_sessions = self.journal.sessions()
        session = str(uuid.uuid4())
        self.journal.add_session(session)
        return session

    def _settle_sessions(self) -> None:
        """In the helper thread, before the last commits are read back: no job of an
        earlier incarnation's session may still run on the server (one that finishes
        after this read would land rows nobody checked: spark_sink's ``settle_session``)."""
        from ..spark.spark_sink import CommitFailed

        earlier = self._earlier_sessions
        if not earlier or self.journal is None:
            return
        for session in earlier:
            try:
                live = self.sink.settle_session(session)
            except CommitFailed as exc:   # cannot tell: better stop than write twice
                raise RuntimeError(f"cannot make sure an earlier incarnation's Spark jobs "
                                   f"are over: {exc.reason}") from None
            if live:
                log.info("%s: %d Spark operation(s) of an earlier incarnation were still "
                         "running; interrupted and waited for", self.id, live)
        self.journal.settled(earlier)

    def _watch_spark(self) -> None:
        """Once a second: while a Spark call has run for more than :data:`PROBE_AFTER`,
        check in a thread of its own whether Spark can be reached at all.  A partition
        leaves the job's call hanging without an error for as long as TCP retries, so
        only a probe tells an operator that Spark is unreachable, and since when
        (``status``: ``spark_unreachable_since``), rather than a job that is just long."""
        self.call_later(1.0, self._watch_spark)
        if self._job is None or self._probing or self.sink is None or \
                time.monotonic() - self._job_started < PROBE_AFTER:
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
                         time.time() - down[0])
            self._down = None
        elif down is None:
            self._down = (at, why)
            log.warning("%s: Spark unreachable (%s); the job waits, and so does the source",
                        self.id, why)
        else:
            self._down = (down[0], why)

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
                "spark_unreachable_since": None if self._down is None else self._down[0],
                "spark_unreachable": None if self._down is None else self._down[1],
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
                msg = protocol.decode(frame)
                if msg[protocol.KIND_AT] == protocol.HELLO:
                    self._on_hello(peer)
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
        gone = self.groups.drop_peer(peer)
        if gone:
            log.info("%s: %s restarted; %d of its batches not yet in a job dropped (they "
                     "are delivered again)", self.id, peer.decode(errors="replace"), len(gone))
        if self.staging is not None and peer in self._seen and self.once:
            # a new incarnation: the producers took back every message in flight
            self._taken_back(self.recent.pop(peer))
        self._seen.add(peer)
        if self.staging is not None:
            # what it staged and never handed over
            self.staging.sweep(peer.decode(errors="replace") + "-",
                               keep=(h.file for h in self._job_items))
        if self.schema_known:
            self._send(peer, self._schema_frame())
        else:
            self.waiting_hello.add(peer)

    def _on_redelivery(self, command: commands.Redelivery) -> None:
        """The daemon says the sources take back what was in flight (a producer restarts,
        or the live ones requeue what a crash lost): no batch processor of ours need
        restart for it (a producer's death), so its hello cannot tell us."""
        if self.staging is None or not self.once:
            return
        log.info("%s: the sources deliver again what was in flight (%s): the recent "
                 "commits and the next %d row(s) are checked for rows already written",
                 self.id, command.reason, WATCH * self.groups.max_rows)
        self._taken_back([])

    def _taken_back(self, files: list[str]) -> None:
        """The sources took back every message in flight, while stale copies of some may
        still be on their way here: the committed batches whose answers may not have
        become acks (those of ``files``, and the recent ones of every batch processor)
        are in doubt, so are those of the running job once it ends, and so is what is
        committed from now on for a while (the watch)."""
        self._doubt_files(files + sorted(self.recent.names()))
        self._restarted = self._restarted or bool(self._job_items)
        self.doubt.watch(WATCH * self.groups.max_rows)

    def _schema_frame(self) -> bytes:
        assert self.staging is not None
        return protocol.schema(self._schema_ipc(), self.schema_error, self.staging.uri)

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
        errors = self._job_out.setdefault("errors", {})
        job = []
        for h in items:
            try:
                self._conform(h)
                job.append(h)
            except (ValueError, OSError, pa.ArrowException) as exc:
                # this batch alone does not fit the dataset (or its file is unreadable)
                errors[id(h)] = f"spark: the batch does not fit the dataset's schema: {exc}"
        if job and self.once:
            self._job_out["again"] = self._again_of(job)
        if job and self.doubt.active():
            try:
                job = self._still_to_write(job)
            except (OSError, pa.ArrowException) as exc:   # cannot check: do not write
                for h in job:
                    errors[id(h)] = f"spark: checking the batch for rows already " \
                                    f"written failed: {exc}"
                job = []
        assert self.schema is not None or not job
        full = self.schema.append(spark_rows.ID_FIELD) if self.schema is not None else None
        self._start("commit", items, lambda: self._commit(job, full))
        self._report_now()

    def _still_to_write(self, job: list[Handed]) -> list[Handed]:
        """The batches of ``job`` with the rows whose message may be in the dataset
        already, or is in an earlier row of the group too, dropped (their staged files
        rewritten; :meth:`.Doubt.check`); a batch with no row left is answered as
        written.  A batch that lost a row as a repeat is answered like the batches of
        the job that are written (:meth:`_follow`): the copy kept is in one of them."""
        assert self.staging is not None
        tables = [self.staging.read(h.file) for h in job]
        masks, follows = self.doubt.check(
            [t.column("message_id").combine_chunks() for t in tables])
        if not any(m is not None for m in masks):
            return job
        out: list[Handed] = []
        skipped = 0
        #: rows left out of each batch, by id(batch): a failed batch writes none anyway
        left_out: dict[int, int] = self._job_out.setdefault("left_out", {})
        for h, table, hit in zip(job, tables, masks):
            if hit is None:
                out.append(h)
                continue
            n = pc.sum(hit).as_py() or 0
            skipped += n
            left_out[id(h)] = left_out.get(id(h), 0) + n
            kept = table.filter(pc.invert(hit))
            if len(kept):
                self.staging.write(kept, h.file)
                out.append(h)
        self._job_out["follows"] = {id(job[i]) for i in follows}
        self._job_out["in_job"] = {id(h) for h in out}
        self.counters["already_written"] += skipped
        log.info("%s: %d row(s) of this group may be in the dataset already (written "
                 "before a restart) or came twice (a stale copy and its redelivery): "
                 "acknowledged, not written again", self.id, skipped)
        return out

    def _again_of(self, job: list[Handed]) -> dict[int, list[str]]:
        """The ids of the redelivered messages of each batch of ``job`` that has any (by
        ``id(batch)``; read from the footers of the files the batch processors marked):
        looked up in the dataset before the job (:meth:`_drop_written`)."""
        assert self.staging is not None
        again: dict[int, list[str]] = {}
        for h in job:
            try:
                ids = self.staging.again(h.file)
            except (OSError, pa.ArrowException, ValueError):
                continue   # an unreadable file: Spark cannot read it either, the job fails
            if ids:
                again[id(h)] = ids
        return again

    def _drop_written(self, job: list[Handed]) -> list[Handed]:
        """In the helper thread, before the job: the redelivered messages of ``job``
        (:meth:`_again_of`) that the dataset already holds are left out of their staged
        files, and acknowledged as written; a batch with no row left is out of the job.

        Why a lookup in Spark rather than a window of recent commits: a redelivery can come
        back any number of commits and restarts after its first copy was written (behind
        a prefetched backlog, after the committer that wrote it died), and the dataset is
        the one record of what was written that no restart loses.  The source's mark says
        which messages can be there at all, so nothing else is looked up."""
        again: dict[int, list[str]] = self._job_out.get("again") or {}
        if not again:
            return job
        assert self.staging is not None
        wanted = pa.array(sorted({i for h in job for i in again.get(id(h), ())}), pa.string())
        if not len(wanted):
            return job
        t0 = time.monotonic()
        found = self.sink.ids_present(self.spec.batcher, wanted)
        self._job_out["looked_up"] = len(wanted)
        self._job_out["lookup_seconds"] = time.monotonic() - t0
        if not len(found):
            return job
        left_out: dict[int, int] = self._job_out.setdefault("left_out", {})
        out: list[Handed] = []
        dropped = 0
        for h in job:
            if id(h) not in again:
                out.append(h)
                continue
            table = self.staging.read(h.file)
            hit = pc.is_in(table.column("message_id"), value_set=found)
            n = pc.sum(hit).as_py() or 0
            if not n:
                out.append(h)
                continue
            dropped += n
            left_out[id(h)] = left_out.get(id(h), 0) + n
            kept = table.filter(pc.invert(hit))
            if len(kept):
                self.staging.write(kept, h.file)
                out.append(h)
        self._job_out["found"] = dropped
        return out

    @staticmethod
    def _follow(out: dict[str, Any], items: list[Handed], errors: dict[int, str]) -> None:
        """A batch that lost rows as repeats of rows kept in other batches of its job is
        written only if those are: when any batch of the job failed, it fails too (with
        that reason), so no message is acknowledged for a row that was not written."""
        follows = out.get("follows")
        if not follows:
            return
        in_job = out.get("in_job", set())
        failed = [errors[i] for i in in_job if i in errors]
        if not failed:
            return
        for h in items:
            if id(h) in follows and id(h) not in errors:
                errors[id(h)] = failed[0]

    def _conform(self, h: Handed) -> None:
        """The staged file in the dataset's schema: the usual case is the same schema
        bytes as the dataset's (one comparison); a batch processor that inferred its own
        before the first commit gets its file rewritten in the dataset's types, or fails."""
        if self.schema is None:   # the first file fixes the dataset's schema
            schema = spark_rows.schema_from_ipc(h.schema)
            self.schema = pa.schema([f for f in schema if f.name != "message_id"])
            self._schema_bytes = spark_rows.schema_to_ipc(self.schema.append(spark_rows.ID_FIELD))
        if h.schema == self._schema_bytes:
            return
        assert self.staging is not None
        staged = self.staging.read(h.file)
        if self.sink_settings.get("evolve"):   # new fields: new columns (spark_evolve)
            from ..spark.spark_evolve import widen_to

            wider = widen_to(self.schema, staged.schema)
            if len(wider) > len(self.schema):
                self.schema = wider
                self._schema_bytes = spark_rows.schema_to_ipc(
                    self.schema.append(spark_rows.ID_FIELD))
        table = spark_rows.conform(staged, self.schema.append(spark_rows.ID_FIELD))
        self.staging.write(table, h.file)
        h.schema = self._schema_bytes

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

    def _prepare(self) -> None:
        """In the helper thread, before the first commit: the dataset's schema (the DDL
        parsed, else the one the dataset already has: fixed by its first commit), and the
        ids of the last commits an earlier incarnation started put in doubt
        (spark_once)."""
        from ..spark.spark_sink import CommitFailed

        try:
            self._job_out["schema"] = self.sink.data_schema()
        except CommitFailed as exc:   # a bad DDL: every message fails with its reason
            self._job_out["schema_error"] = exc.reason
        if self._job_out.get("schema") is None and "schema_error" not in self._job_out:
            try:
                self._job_out["schema"] = self.sink.existing_schema(self.spec.batcher)
            except CommitFailed as exc:   # Spark unreachable: the first batch decides
                log.warning("%s: could not read the dataset's schema (%s); the first batch "
                            "fixes it", self.id, exc.reason)
        self._settle_sessions()
        stamps = self.journal.last(RECOVER) if self.journal is not None else []
        if stamps:
            try:
                ids = self.sink.ids_of(self.spec.batcher, stamps)
            except CommitFailed as exc:   # cannot tell: better stop than write twice
                raise RuntimeError(f"cannot read the last commits back: {exc.reason}") \
                    from None
            self.doubt.add(ids)
            # the producers took back what was in flight; stale copies may still come
            self.doubt.watch(WATCH * self.groups.max_rows)
            log.info("%s: %d row(s) of the last %d commit(s) before this start are in "
                     "doubt: their messages are acknowledged, not written again, if they "
                     "come back", self.id, len(ids), len(stamps))

    def _commit(self, job: list[Handed], schema: pa.Schema | None) -> None:
        """In the helper thread: one Spark job for the whole group (Spark reads the staged
        files itself); if Spark rejects it outright, one job per batch so that only the
        culprit fails."""
        from ..spark.spark_sink import CommitFailed

        errors: dict[int, str] = self._job_out["errors"]
        if job:
            try:
                job = self._drop_written(job)
            except CommitFailed as exc:   # cannot check: do not write
                for h in job:
                    errors[id(h)] = f"spark: looking up redelivered messages in the " \
                                    f"dataset failed: {exc.reason}"
                return
        if not job:
            return
        assert self.staging is not None and schema is not None
        uri = self.staging.spark_uri
        stamp = self.sink.next_stamp()
        if self.journal is not None:   # durably before the job: a crash leaves it in doubt
            self.journal.record(stamp)
        try:
            self.sink.commit_files(self.spec.batcher, [uri(h.file) for h in job], schema,
                                   stamp=stamp)
            return
        except CommitFailed as exc:
            if not exc.permanent or len(job) == 1:
                for h in job:
                    errors[id(h)] = exc.reason
                return
        for h in job:
            try:
                stamp = self.sink.next_stamp()
                if self.journal is not None:
                    self.journal.record(stamp)
                self.sink.commit_files(self.spec.batcher, [uri(h.file)], schema, stamp=stamp)
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

    def _keep_or_remove(self, items: list[Handed], errors: dict[int, str] | None) -> None:
        """Staged files of a finished job: a committed batch's stays in its batch
        processor's window (its ids are in doubt if that one restarts; the file falling
        out of the window goes), the others go now."""
        assert self.staging is not None
        gone = []
        committed = []
        for h in items:
            if errors is None or id(h) in errors:
                gone.append(h.file)
                continue
            if not self.once:   # nobody will read its ids again
                gone.append(h.file)
                continue
            committed.append(h.file)
            old = self.recent.add(h.peer, h.file)
            if old is not None:
                gone.append(old)
        if committed and (self._restarted or self.doubt.watching):
            # answers that may have gone to a dead incarnation, or rows a stale copy of
            # which may still come: in doubt
            for name in committed:
                try:
                    ids = self.staging.read(name).column("message_id")
                except (OSError, pa.ArrowException):
                    continue
                if self._restarted:
                    self.doubt.add(ids)
                self.doubt.committed(ids)
        self._restarted = False
        self.staging.remove(gone)

    def _count_found(self, out: dict[str, Any]) -> None:
        """The redelivered messages the job's lookup found in the dataset: counted as
        ``already_written`` (``looked_up``: how many were looked up)."""
        if "looked_up" not in out:
            return
        self.counters["looked_up"] += out["looked_up"]
        found = out.get("found", 0)
        self.counters["already_written"] += found
        log.info("%s: %d of %d redelivered message(s) of this group are in the dataset "
                 "already (looked up in %.2f s): acknowledged, not written again", self.id,
                 found, out["looked_up"], out["lookup_seconds"])

    def _doubt_files(self, names: list[str]) -> None:
        assert self.staging is not None
        for name in names:
            try:
                self.doubt.add(self.staging.read(name).column("message_id"))
            except (OSError, pa.ArrowException):
                pass

    def _finish_job(self) -> None:
        from ..spark.spark_sink import WriteAbandoned

        assert self._job is not None
        self._job.join()
        out, items, kind = self._job_out, self._job_items, self._job_kind
        self._job, self._job_items, self._job_out = None, [], {}
        took = time.monotonic() - self._job_started
        raised = out.get("raised")
        if self.staging is not None and items:
            self._keep_or_remove(items, out["errors"] if raised is None else None)
        if isinstance(raised, WriteAbandoned):
            log.warning("%s: stopping; %d batch(es) left unacked (Spark write abandoned "
                        "between retries)", self.id, len(items))
            raise StageExit from None
        if raised is not None:
            raise raised   # a bug: let the supervisor see it
        if kind == "schema":
            self.schema_known = True
            if out.get("schema") is not None:
                self.schema = out["schema"]
                self._schema_bytes = spark_rows.schema_to_ipc(
                    self.schema.append(spark_rows.ID_FIELD))
            self.schema_error = out.get("schema_error")
            frame = self._schema_frame()
            for peer in self.waiting_hello:
                self._send(peer, frame)
            self.waiting_hello.clear()
            return
        errors: dict[int, str] = out["errors"]
        self._count_found(out)
        schema_ipc = self._schema_ipc()
        # the rows this job wrote: its batches that did not fail, less the rows left out
        # of them as already written (a failed job wrote none, whatever was left out)
        left_out: dict[int, int] = out.get("left_out", {})
        rows = sum(h.rows - left_out.get(id(h), 0) for h in items if id(h) not in errors)
        if rows:
            self._reachable(None, time.time())   # it wrote: Spark answers
            self.counters["commits"] += 1
            self.counters["out"] += rows
            self._last_commit = (time.time(), rows, took)
            self.metrics.observe("spark_write", took, self.spec.batcher)
            self.metrics.observe("spark_commit_rows", rows, self.spec.batcher)
        self._follow(out, items, errors)
        if errors:
            self.counters["commit_failures"] += 1
            self.counters["failed"] += sum(h.rows for h in items if id(h) in errors)
        # the books before the answers: the daemon's count of rows written must not trail
        # the acks those answers bring about
        self._report_now()
        for h in items:
            self._send(h.peer, protocol.result(h.ref, errors.get(id(h)), schema_ipc))
