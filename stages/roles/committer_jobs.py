"""The committer's job lifecycle, pure and synchronous: what to commit and when, what is
in doubt after a restart, what a failed write means.

:class:`CommitterJobs` holds the committer's books (the batches waiting, the dataset's
schema, the ids in doubt, the recent files of each batch processor) and turns them into
:class:`Job` records and back into answers.  It has no socket, no thread and no pyspark:
the stage (:mod:`.committer`) runs its loop, hands a job to a helper thread and sends the
answers; the Spark sink and the journal of commit stamps come in through the seam,
:class:`SparkPort` and :class:`JournalPort` (the real ones:
:class:`~offbroadway.stages.spark.spark_sink.SparkSink` and
:class:`~offbroadway.stages.spark.spark_once.Journal`), so a unit test drives a committer
with a fake Spark (``tests/stages/test_committer_jobs.py``).

A job's life (docs/design-spark.md §4-5):

1. :meth:`CommitterJobs.schema_job` then :meth:`~CommitterJobs.prepare` (helper thread),
   once, before any commit: the dataset's schema, an earlier incarnation's Spark sessions
   settled, the ids of the journal's last commits put in doubt;
2. :meth:`~CommitterJobs.plan` (loop), when :class:`.spark_commit.CommitGroups` says so:
   the group's batches conformed to the dataset's schema and checked against the ids in
   doubt;
3. :meth:`~CommitterJobs.commit` (helper thread): redelivered ids looked up in the
   dataset, the stamp journaled, one Spark job (one per batch if Spark rejects the
   group outright);
4. :meth:`~CommitterJobs.finish` (loop): staged files kept or removed, the books, and
   one answer per batch.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from ..runtime.spec import CommitterSpark
from ..spark import spark_rows
from ..spark.spark_commit import (
    DEFAULT_INTERVAL,
    DEFAULT_ROWS,
    Answer,
    CommitGroups,
    Finished,
    Handed,
)
from ..spark.spark_failures import CommitFailed
from ..spark.spark_once import PEER_BATCHES, RECOVER, WATCH, Doubt, RecentFiles
from ..spark.spark_staging import MERGED_PREFIX, StagingDir

__all__ = ["Answer", "CommitterJobs", "Finished", "Job", "JournalPort", "SparkPort"]

log = logging.getLogger("offbroadway.committer")


class SparkPort(Protocol):
    """What the committer asks of Spark: the seam its jobs go through (each call may raise
    :class:`CommitFailed`, or
    :class:`~offbroadway.stages.spark.spark_failures.WriteAbandoned` when told to stop)."""

    connect_timeout: float

    def data_schema(self) -> pa.Schema | None: ...
    def existing_schema(self, batcher: str) -> pa.Schema | None: ...
    def settle_session(self, session_id: str) -> int: ...
    def ids_of(self, batcher: str, stamps: Sequence[datetime]) -> pa.Array: ...
    def ids_present(self, batcher: str, ids: pa.Array) -> pa.Array: ...
    def next_stamp(self) -> datetime: ...
    def commit_files(self, batcher: str, files: Sequence[str], schema: pa.Schema,
                     rows: int | None = None, stamp: datetime | None = None,
                     stamped: bool = False) -> datetime: ...
    def probe(self, timeout: float = 2.0) -> str | None: ...
    def close(self) -> None: ...


class JournalPort(Protocol):
    """The committer's durable books: the stamps of its commits and the Spark sessions of
    its incarnations (a local file, :class:`~offbroadway.stages.spark.spark_once.Journal`)."""

    def last(self, n: int = RECOVER) -> list[datetime]: ...
    def ended_clean(self) -> bool: ...
    def record(self, stamp: datetime) -> None: ...
    def sessions(self) -> list[str]: ...
    def add_session(self, session_id: str) -> None: ...
    def settled(self, settled: list[str]) -> None: ...


@dataclass
class Job:
    """One job of the committer's helper thread: the first one (``kind`` "schema") or a
    group commit ("commit"), and what came of it.

    Crosses a thread boundary: the stage loop builds it (:meth:`CommitterJobs.plan`), the
    helper thread fills it in (:meth:`CommitterJobs.prepare`, :meth:`CommitterJobs.commit`)
    and the loop reads it back (:meth:`CommitterJobs.finish`) only once the thread has
    ended; the stage's done pipe orders the two, so nothing here is shared while both run.
    Batches are keyed by ``id(batch)``: the :class:`.spark_commit.Handed` objects of
    ``items`` live as long as the job."""

    kind: str
    #: the batches the job answers (all of the group, whether written, left out or failed)
    items: list[Handed] = field(default_factory=list)
    #: the batches Spark is to write: ``items`` less the misfits and the batches whose
    #: every row is in the dataset already
    work: list[Handed] = field(default_factory=list)
    #: the dataset's schema the files are read with (data columns and ``message_id``)
    read_schema: pa.Schema | None = None
    #: monotonic seconds when the helper thread started it
    started: float = 0.0
    #: why a batch failed, by ``id(batch)``
    errors: dict[int, str] = field(default_factory=dict)
    #: what the helper thread raised (a :class:`WriteAbandoned`, or a bug)
    raised: BaseException | None = None
    # -- the schema job
    schema: pa.Schema | None = None
    schema_error: str | None = None
    # -- a commit: the rows left out of each batch as already written, by ``id(batch)``
    left_out: dict[int, int] = field(default_factory=dict)
    #: the batches that lost a row as a repeat of a row kept in another batch of the job
    follows: set[int] = field(default_factory=set)
    #: the batches still in the job after the check against the ids in doubt
    in_job: set[int] = field(default_factory=set)
    #: the redelivered ids of each batch that has any (from its staged file's footer)
    again: dict[int, list[str]] = field(default_factory=dict)
    #: the lookup of ``again`` in the dataset: ids asked about (None: no lookup), found,
    #: seconds it took
    looked_up: int | None = None
    found: int = 0
    lookup_seconds: float = 0.0


class CommitterJobs:
    """The committer's books and its jobs' lifecycle (see the module docstring).

    ``writer``: the stage's id (log lines); ``batcher``: the dataset's key; ``counters``:
    the stage's counters, which the books update (``already_written``, ``looked_up``,
    ``commits``, ``out``, ``failed``, ``commit_failures``); ``journal`` None: no exactly
    once.  ``sink`` and ``staging`` may come later (the stage makes them in its setup)."""

    def __init__(self, settings: CommitterSpark, *, writer: str, batcher: str,
                 counters: MutableMapping[str, int], journal: JournalPort | None,
                 sink: SparkPort | None = None, staging: StagingDir | None = None) -> None:
        self.id = writer
        self._merges = itertools.count(1)   # a merged group file's number
        self.batcher = batcher
        self.counters = counters
        self.groups = CommitGroups(rows=int(settings.commit_rows or DEFAULT_ROWS),
                                   interval=float(settings.commit_interval or DEFAULT_INTERVAL))
        #: ``[spark] exactly_once = false``: no journal of commit stamps, no ids in doubt
        #: (a restart may write again what its last commits held: at-least-once)
        self.once = bool(settings.exactly_once)
        self.journal = journal if self.once else None
        #: ``[spark] schema = "evolve"``: new fields become new columns (spark_evolve)
        self.evolve = settings.sink.evolve
        self.doubt = Doubt()
        # a batch processor's answered batches not yet acked are at most its demand (the
        # topology's, given here): all of their files are kept (at least PEER_BATCHES)
        self.recent = RecentFiles(max(PEER_BATCHES, int(settings.peer_batches or 0)))
        self.sink = sink
        self.staging = staging
        #: batch processors seen saying hello (a second hello: a new incarnation)
        self.seen: set[bytes] = set()
        #: a batch processor restarted while a job ran: its batches are all in doubt
        self.restarted = False
        self.schema: pa.Schema | None = None          # the dataset's data columns
        self._schema_bytes: bytes | None = None        # with message_id, as IPC
        self.schema_error: str | None = None
        #: the dataset's schema is known (no DDL to parse) and the ids in doubt after an
        #: earlier incarnation are loaded: commits may start
        self.schema_known = False
        #: the job the helper thread runs (None: none)
        self.running: Job | None = None
        self.earlier_sessions: list[str] = []

    # -- sessions ------------------------------------------------------------------------
    def new_session(self) -> str | None:
        """This incarnation's Spark Connect session id, journaled before its first call;
        the earlier incarnations' still there are settled before the first commit
        (:meth:`settle_sessions`).  None without exactly once."""
        if self.journal is None:
            return None
        self.earlier_sessions = self.journal.sessions()
        session = str(uuid.uuid4())
        self.journal.add_session(session)
        return session

    def settle_sessions(self) -> None:
        """In the helper thread, before the last commits are read back: no job of an
        earlier incarnation's session may still run on the server (one that finishes
        after this read would land rows nobody checked: spark_sink's ``settle_session``)."""
        earlier = self.earlier_sessions
        if not earlier or self.journal is None:
            return
        assert self.sink is not None
        # after a clean stop the earlier session was released: nothing to say about it
        crashed = not self.journal.ended_clean()
        for session in earlier:
            try:
                live = self.sink.settle_session(session)
            except CommitFailed as exc:   # cannot tell: better stop than write twice
                raise RuntimeError(f"cannot make sure an earlier incarnation's Spark jobs "
                                   f"are over: {exc.reason}") from None
            if live or crashed:
                log.info("%s: an earlier incarnation's Spark session settled: %s", self.id,
                         f"{live} operation(s) still running, interrupted and waited for"
                         if live else "none of its operations was still running")
        self.journal.settled(earlier)

    # -- batch processors ----------------------------------------------------------------
    def hello(self, peer: bytes) -> None:
        """A batch processor said hello: a second hello is a new incarnation, whose
        batches not yet in a job are dropped (they are delivered again) and whose recent
        commits are in doubt; what it staged and never handed over goes."""
        gone = self.groups.drop_peer(peer)
        if gone:
            log.info("%s: %s restarted; %d of its batches not yet in a job dropped (they "
                     "are delivered again)", self.id, peer.decode(errors="replace"), len(gone))
        if self.staging is not None and peer in self.seen and self.once:
            # a new incarnation: the producers took back every message in flight
            self.taken_back(self.recent.pop(peer))
        self.seen.add(peer)
        if self.staging is not None:
            # what it staged and never handed over
            running = self.running.items if self.running is not None else []
            self.staging.sweep(peer.decode(errors="replace") + "-",
                               keep=(h.file for h in running))

    def redelivery(self, reason: str) -> None:
        """The daemon says the sources take back what was in flight (a producer restarts,
        or the live ones requeue what a crash lost): no batch processor of ours need
        restart for it (a producer's death), so its hello cannot tell us."""
        if self.staging is None or not self.once:
            return
        log.info("%s: the sources deliver again what was in flight (%s): the recent "
                 "commits and the next %d row(s) are checked for rows already written",
                 self.id, reason, WATCH * self.groups.max_rows)
        self.taken_back([])

    def taken_back(self, files: list[str]) -> None:
        """The sources took back every message in flight, while stale copies of some may
        still be on their way here: the committed batches whose answers may not have
        become acks (those of ``files``, and the recent ones of every batch processor)
        are in doubt, so are those of the running job once it ends, and so is what is
        committed from now on for a while (the watch)."""
        self._doubt_files(files + sorted(self.recent.names()))
        self.restarted = self.restarted or bool(self.running is not None and
                                                self.running.items)
        self.doubt.watch(WATCH * self.groups.max_rows)

    def schema_ipc(self) -> bytes | None:
        return spark_rows.schema_to_ipc(self.schema) if self.schema is not None else None

    # -- the first job: schema and what is in doubt ----------------------------------------
    def schema_job(self) -> Job:
        self.running = Job("schema")
        return self.running

    def prepare(self, job: Job) -> None:
        """In the helper thread, before the first commit: the dataset's schema (the DDL
        parsed, else the one the dataset already has: fixed by its first commit), and the
        ids of the last commits an earlier incarnation started put in doubt
        (spark_once)."""
        assert self.sink is not None
        try:
            job.schema = self.sink.data_schema()
        except CommitFailed as exc:   # a bad DDL: every message fails with its reason
            job.schema_error = exc.reason
        if job.schema is None and job.schema_error is None:
            try:
                job.schema = self.sink.existing_schema(self.batcher)
            except CommitFailed as exc:   # Spark unreachable: the first batch decides
                log.warning("%s: could not read the dataset's schema (%s); the first batch "
                            "fixes it", self.id, exc.reason)
        self.settle_sessions()
        stamps = self.journal.last(RECOVER) if self.journal is not None else []
        if stamps and self.journal is not None and self.journal.ended_clean():
            # the last run ended with every committed row acknowledged at its source: no
            # message of those commits comes back, so nothing is in doubt (and no line
            # says otherwise)
            log.debug("%s: the last run ended with every commit acknowledged; nothing in "
                      "doubt", self.id)
            stamps = []
        if stamps:
            try:
                ids = self.sink.ids_of(self.batcher, stamps)
            except CommitFailed as exc:   # cannot tell: better stop than write twice
                raise RuntimeError(f"cannot read the last commits back: {exc.reason}") \
                    from None
            self.doubt.add(ids)
            # the producers took back what was in flight; stale copies may still come
            self.doubt.watch(WATCH * self.groups.max_rows)
            log.info("%s: %d row(s) of the last %d commit(s) before this start are in "
                     "doubt: their messages are acknowledged, not written again, if they "
                     "come back", self.id, len(ids), len(stamps))

    # -- a group commit --------------------------------------------------------------------
    def plan(self) -> Job:
        """The next commit (the caller knows that :attr:`groups` is ready and that no job
        runs): the waiting batches, each conformed to the dataset's schema (a misfit fails
        alone) and checked against the ids in doubt."""
        items = self.groups.take()
        job = Job("commit", items)
        for h in items:
            try:
                self._conform(h)
                job.work.append(h)
            except (ValueError, OSError, pa.ArrowException) as exc:
                # this batch alone does not fit the dataset (or its file is unreadable)
                job.errors[id(h)] = f"spark: the batch does not fit the dataset's schema: {exc}"
        if job.work and self.once:
            job.again = self._again_of(job.work)
        if job.work and (self.doubt.active() or job.again):
            # a redelivered message's stale copy may be in this group: repeats checked
            try:
                job.work = self._still_to_write(job, job.work)
            except (OSError, pa.ArrowException) as exc:   # cannot check: do not write
                for h in job.work:
                    job.errors[id(h)] = f"spark: checking the batch for rows already " \
                                        f"written failed: {exc}"
                job.work = []
        assert self.schema is not None or not job.work
        job.read_schema = self.schema.append(spark_rows.ID_FIELD) \
            if self.schema is not None else None
        self.running = job
        return job

    def _still_to_write(self, job: Job, work: list[Handed]) -> list[Handed]:
        """The batches of ``work`` with the rows whose message may be in the dataset
        already, or is in an earlier row of the group too, dropped (their staged files
        rewritten; :meth:`.Doubt.check`); a batch with no row left is answered as
        written.  A batch that lost a row as a repeat is answered like the batches of
        the job that are written (:meth:`_follow`): the copy kept is in one of them."""
        assert self.staging is not None
        tables = [self.staging.read(h.file) for h in work]
        masks, follows = self.doubt.check(
            [t.column("message_id").combine_chunks() for t in tables])
        if not any(m is not None for m in masks):
            return work
        out: list[Handed] = []
        skipped = 0
        for h, table, hit in zip(work, tables, masks):
            if hit is None:
                out.append(h)
                continue
            skipped += self._leave_out(job, h, table, hit, out)
        job.follows = {id(work[i]) for i in follows}
        job.in_job = {id(h) for h in out}
        self.counters["already_written"] += skipped
        log.info("%s: %d row(s) of this group may be in the dataset already (written "
                 "before a restart) or came twice (a stale copy and its redelivery): "
                 "acknowledged, not written again", self.id, skipped)
        return out

    def _again_of(self, work: list[Handed]) -> dict[int, list[str]]:
        """The ids of the redelivered messages of each batch of ``work`` that has any (by
        ``id(batch)``; read from the footers of the files the batch processors marked):
        looked up in the dataset before the job (:meth:`_drop_written`)."""
        assert self.staging is not None
        again: dict[int, list[str]] = {}
        for h in work:
            try:
                ids = self.staging.again(h.file)
            except (OSError, pa.ArrowException, ValueError):
                continue   # an unreadable file: Spark cannot read it either, the job fails
            if ids:
                again[id(h)] = ids
        return again

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
        if self.evolve:   # new fields: new columns (spark_evolve)
            from ..spark.spark_evolve import widen_to

            wider = widen_to(self.schema, staged.schema)
            if len(wider) > len(self.schema):
                self.schema = wider
                self._schema_bytes = spark_rows.schema_to_ipc(
                    self.schema.append(spark_rows.ID_FIELD))
        table = spark_rows.conform(staged, self.schema.append(spark_rows.ID_FIELD))
        self.staging.write(table, h.file)
        h.schema = self._schema_bytes

    def commit(self, job: Job) -> None:
        """In the helper thread: one Spark job for the whole group (Spark reads the staged
        files itself); if Spark rejects it outright, one job per batch so that only the
        culprit fails."""
        work = job.work
        if work:
            try:
                work = self._drop_written(job, work)
            except CommitFailed as exc:   # cannot check: do not write
                for h in work:
                    job.errors[id(h)] = f"spark: looking up redelivered messages in the " \
                                        f"dataset failed: {exc.reason}"
                return
        if not work:
            return
        assert self.staging is not None and self.sink is not None
        assert job.read_schema is not None
        uri = self.staging.spark_uri
        stamp = self.sink.next_stamp()
        if self.journal is not None:   # durably before the job: a crash leaves it in doubt
            self.journal.record(stamp)
        merged: str | None = f"{MERGED_PREFIX}{self.id}-{next(self._merges)}.parquet"
        why = self.staging.merge([h.file for h in work], merged, stamp)
        if why is not None:   # Spark reads them as they are, the stamp in the plan
            log.info("%s: the group's files could not be merged: %s", self.id, why)
            merged = None
        try:
            files = [uri(merged)] if merged else [uri(h.file) for h in work]
            self.sink.commit_files(self.batcher, files, job.read_schema, stamp=stamp,
                                   stamped=merged is not None)
            return
        except CommitFailed as exc:
            if not exc.permanent or len(work) == 1:
                for h in work:
                    job.errors[id(h)] = exc.reason
                return
        finally:
            if merged:
                self.staging.remove([merged])
        for h in work:
            try:
                stamp = self.sink.next_stamp()
                if self.journal is not None:
                    self.journal.record(stamp)
                self.sink.commit_files(self.batcher, [uri(h.file)], job.read_schema,
                                       stamp=stamp)
            except CommitFailed as exc:
                job.errors[id(h)] = exc.reason

    def _drop_written(self, job: Job, work: list[Handed]) -> list[Handed]:
        """In the helper thread, before the job: the redelivered messages of ``work``
        (:meth:`_again_of`) that the dataset already holds are left out of their staged
        files, and acknowledged as written; a batch with no row left is out of the job.

        Why a lookup in Spark rather than a window of recent commits: a redelivery can come
        back any number of commits and restarts after its first copy was written (behind
        a prefetched backlog, after the committer that wrote it died), and the dataset is
        the one record of what was written that no restart loses.  The source's mark says
        which messages can be there at all, so nothing else is looked up."""
        again = job.again
        if not again:
            return work
        assert self.staging is not None and self.sink is not None
        wanted = pa.array(sorted({i for h in work for i in again.get(id(h), ())}),
                          pa.string())
        if not len(wanted):
            return work
        t0 = time.monotonic()
        found = self.sink.ids_present(self.batcher, wanted)
        job.looked_up = len(wanted)
        job.lookup_seconds = time.monotonic() - t0
        if not len(found):
            return work
        out: list[Handed] = []
        dropped = 0
        for h in work:
            if id(h) not in again:
                out.append(h)
                continue
            table = self.staging.read(h.file)
            dropped += self._leave_out(
                job, h, table, pc.is_in(table.column("message_id"), value_set=found), out)
        job.found = dropped
        return out

    def _leave_out(self, job: Job, h: Handed, table: pa.Table, hit: pa.Array,
                   out: list[Handed]) -> int:
        """Drop the rows ``hit`` marks from batch ``h``'s staged file (rewritten; the
        batch stays in the job, in ``out``, only if a row is left); how many were dropped."""
        assert self.staging is not None
        n = pc.sum(hit).as_py() or 0
        if not n:
            out.append(h)
            return 0
        job.left_out[id(h)] = job.left_out.get(id(h), 0) + n
        kept = table.filter(pc.invert(hit))
        if len(kept):
            self.staging.write(kept, h.file)
            out.append(h)
        return n

    # -- a job is over -----------------------------------------------------------------------
    def finish(self, job: Job) -> Finished | None:
        """Back in the loop once the helper thread has ended: the job's staged files kept
        or removed, then what it raised re-raised (``WriteAbandoned``: the committer
        stops, its batches unanswered; anything else is a bug); for the schema job the
        schema adopted (None returned: nothing to answer), for a commit the books and one
        answer per batch."""
        self.running = None
        if self.staging is not None and job.items:
            self._keep_or_remove(job.items, job.errors if job.raised is None else None)
        if job.raised is not None:
            raise job.raised
        if job.kind == "schema":
            self.schema_known = True
            if job.schema is not None:
                self.schema = job.schema
                self._schema_bytes = spark_rows.schema_to_ipc(
                    self.schema.append(spark_rows.ID_FIELD))
            self.schema_error = job.schema_error
            return None
        errors = job.errors
        self._count_found(job)
        # the rows this job wrote: its batches that did not fail, less the rows left out
        # of them as already written (a failed job wrote none, whatever was left out)
        rows = sum(h.rows - job.left_out.get(id(h), 0) for h in job.items
                   if id(h) not in errors)
        if rows:
            self.counters["commits"] += 1
            self.counters["out"] += rows
        self._follow(job)
        if errors:
            self.counters["commit_failures"] += 1
            self.counters["failed"] += sum(h.rows for h in job.items if id(h) in errors)
        return Finished(rows, [Answer(h.peer, h.ref, errors.get(id(h))) for h in job.items])

    @staticmethod
    def _follow(job: Job) -> None:
        """A batch that lost rows as repeats of rows kept in other batches of its job is
        written only if those are: when any batch of the job failed, it fails too (with
        that reason), so no message is acknowledged for a row that was not written."""
        if not job.follows:
            return
        errors = job.errors
        failed = [errors[i] for i in job.in_job if i in errors]
        if not failed:
            return
        for h in job.items:
            if id(h) in job.follows and id(h) not in errors:
                errors[id(h)] = failed[0]

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
        if committed and (self.restarted or self.doubt.watching):
            # answers that may have gone to a dead incarnation, or rows a stale copy of
            # which may still come: in doubt
            for name in committed:
                try:
                    ids = self.staging.read(name).column("message_id")
                except (OSError, pa.ArrowException):
                    continue
                if self.restarted:
                    self.doubt.add(ids)
                self.doubt.committed(ids)
        self.restarted = False
        self.staging.remove(gone)

    def _count_found(self, job: Job) -> None:
        """The redelivered messages the job's lookup found in the dataset: counted as
        ``already_written`` (``looked_up``: how many were looked up)."""
        if job.looked_up is None:
            return
        self.counters["looked_up"] += job.looked_up
        self.counters["already_written"] += job.found
        log.info("%s: %d of %d redelivered message(s) of this group are in the dataset "
                 "already (looked up in %.2f s): acknowledged, not written again", self.id,
                 job.found, job.looked_up, job.lookup_seconds)

    def _doubt_files(self, names: list[str]) -> None:
        assert self.staging is not None
        for name in names:
            try:
                self.doubt.add(self.staging.read(name).column("message_id"))
            except (OSError, pa.ArrowException):
                pass

