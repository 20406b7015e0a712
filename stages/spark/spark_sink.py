"""The Spark side of a dataset: one Spark Connect session that commits staged Parquet files.

Used by a batcher's committer (:mod:`.committer`), which groups the batches of all its
batch processors into one Spark job, and by anything that writes batches on its own
(:meth:`SparkSink.write`: convert, stage and commit in one go).  It pulls in pyspark's
Connect client (pandas, pyarrow, grpc: ~135 MB, ~0.8 s), which no other stage should pay
for.

Where it connects, with which token
    ``remote`` (``sc://host:port``) from the settings, else what the daemon handed over for
    its own server; the token from ``token_file``, ``token_env`` or the hand-over, read at
    every new session (:mod:`.spark_remote`: the variable names and the rules).

What lands where
    One dataset per batcher: ``<output>/<batcher>/[<partition_by>=…/]part-….parquet``, one
    row per message: the fields of ``message.data`` plus ``message_id`` (string) and
    ``ingested_at`` (UTC timestamp of the commit).  ``spark.read.parquet("<output>/<batcher>")``
    reads it; no column is added by the layout.

How a commit works (docs/design-spark.md §3-4)
    The rows are already Parquet files in the staging area (:mod:`.spark_staging`); one
    Spark job reads the whole group (``spark.read.schema(…).parquet(files)``), adds
    ``ingested_at`` (the commit's stamp: unique per commit, its identity, see
    :mod:`.spark_once`) and appends it to the dataset: Spark alone writes the output, so
    an output only the Spark cluster can see works.  Two Spark jobs appending into one
    directory share its ``_temporary`` and each job's commit deletes it (rows of the other
    job vanish while it *reports success*, measured), so jobs must never overlap: writers
    sharing a staging area take a lock per dataset around each job, one committer per
    dataset runs one job at a time, and its jobs are not reattachable, so the server
    interrupts a job whose client died (a SIGKILLed committer leaves no job running
    behind its successor's back).

Schema
    ``schema`` is a Spark DDL string (``"seq BIGINT, payload STRING, at TIMESTAMP"``),
    parsed by the server (:meth:`SparkSink.data_schema`); else the schema is inferred from
    the first batch (see :mod:`.spark_rows` for the strict conversion rules).  ``message_id``
    and ``ingested_at`` are reserved.

Faults
    The Spark call runs in a helper thread while this thread calls ``on_wait()`` every
    second, so a long write does not trip a watchdog.  Transient failures (Connect
    unreachable, gRPC UNAVAILABLE, a lost session, a failed Spark job) are retried with
    exponential backoff and jitter (tenacity) for up to ``write_retry_seconds``; a commit
    that still fails, or one that Spark rejects outright (analysis errors, a bad DDL),
    raises :class:`CommitFailed` with a reason.  A single Spark call that runs past
    ``write_timeout`` (default 600 s) is abandoned (its channel closed) and counts as a
    failed attempt.

By job: this module is the table commit (a group of staged files, one Spark job, the
dataset lock, the DDL) and :meth:`SparkSink.write`; :mod:`.spark_session` the session and
the bounded, retried calls; :mod:`.spark_reads` the dataset's reads (schema, the ids of
the last commits, redelivered ids); :mod:`.spark_failures` what a failure means.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import tempfile
import time
import uuid
import warnings
from datetime import UTC, datetime, timedelta
from typing import Any, Callable, Iterator, Sequence

import pyarrow as pa
from offbroadway import Message
from pyspark.errors.exceptions.connect import AnalysisException
from pyspark.sql.connect import functions as F
from pyspark.sql.connect.session import SparkSession
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

from . import spark_remote
from .spark_failures import CommitFailed, Permanent, WriteAbandoned, missing, one_line
from .spark_reads import SAFE_NAME, DatasetReads
from .spark_rows import RESERVED, convert
from .spark_schema import SchemaProblem, ddl_fields_to_arrow
from .spark_session import PERMANENT, SESSION_CONF, transient
from .spark_staging import StagingDir

__all__ = ["FORMATS", "RESERVED", "SESSION_CONF", "CommitFailed", "SparkSink",
           "WriteAbandoned"]

log = logging.getLogger("offbroadway.spark_sink")
# pyspark warns each time its (deliberately short) client retry policy gives up; our own
# retry loop logs every failed attempt with its reason instead.
warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]")

FORMATS = ("parquet", "json", "orc")


class SparkSink(DatasetReads):
    """Commits Arrow tables through one Spark Connect session (see the module docstring)."""

    def __init__(self, *, remote: str | None = None, output: str, format: str = "parquet",
                 partition_by: Sequence[str] = (), schema: str | None = None,
                 writer_id: str, on_wait: Callable[[], None] = lambda: None,
                 should_stop: Callable[[], bool] = lambda: False,
                 token_env: str | None = None, token_file: str | None = None,
                 write_retry_seconds: float = 60.0, write_timeout: float = 600.0,
                 staging: str | None = None, table: str | None = None,
                 session_id: str | None = None, evolve: bool = False,
                 use_ssl: bool = False, ca_file: str | None = None,
                 connect_timeout: float = 2.0,
                 **options: Any) -> None:
        remote = remote or os.environ.get(spark_remote.ENV_REMOTE)
        if not remote:
            raise ValueError(f"SparkSink needs remote= or {spark_remote.ENV_REMOTE} in the "
                             f"environment")
        if format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
        if not output and not table:
            raise ValueError("output (or table) is required")
        if not SAFE_NAME.match(writer_id):
            raise ValueError(f"writer_id {writer_id!r} is not a safe directory name")
        for col in partition_by:
            if col in RESERVED:
                raise ValueError(f"partition_by cannot use the reserved column {col!r}")
        self.remote = spark_remote.normalize_remote(remote)
        self.output = (output or "").rstrip("/")
        #: a table of Spark's catalog per batcher ("{batcher}" replaced), else None
        self.table = table or None
        self.format = format
        self.partition_by = tuple(partition_by)
        self.ddl = schema or None
        #: ``[spark] schema = "evolve"``: new columns are added (spark_evolve); the
        #: dataset is read with ``mergeSchema`` (its files' schemas differ)
        self.evolve = evolve
        self.writer_id = writer_id
        self.on_wait = on_wait
        self.should_stop = should_stop
        self.token_env = token_env
        self.token_file = token_file
        self.write_retry_seconds = float(write_retry_seconds)
        self.write_timeout = float(write_timeout)
        self.options = {str(k): str(v) for k, v in options.items()}
        #: the server-side session's id (a UUID), chosen by the owner so that it can be
        #: journaled before the first call (:meth:`settle_session`); None: pyspark's own
        self.session_id = session_id
        #: TLS to the remote (``use_ssl``, or a ``ca_file`` of PEM roots to trust instead of
        #: the bundled ones); a connection that does not come up within
        #: ``connect_timeout`` counts as Spark unreachable (:meth:`probe`)
        self.use_ssl = bool(use_ssl or ca_file)
        self.ca_file = ca_file or None
        self.connect_timeout = float(connect_timeout)
        self._spark: SparkSession | None = None
        self._spark_schema: StructType | None = None   # from the DDL, with our columns
        self._arrow_schema: pa.Schema | None = None     # from the DDL, data columns only
        self._inferred: dict[str, pa.Schema] = {}
        self._permanent_error: str | None = None
        #: where :meth:`write` stages (the committer stages through its batch processors)
        self.staging = staging or os.path.join(tempfile.gettempdir(),
                                               f"offbroadway-staging-{os.getuid()}")
        self._last_stamp = datetime.min.replace(tzinfo=UTC)
        self.stats = {"writes": 0, "rows": 0, "retries": 0, "failed_batches": 0,
                      "failed_rows": 0}
        self._track()

    # -- public ----------------------------------------------------------------------------
    def data_schema(self) -> pa.Schema | None:
        """The DDL's data columns as Arrow (parsed by the server, retried like a write), or
        None without a DDL.  Raises :class:`CommitFailed` (``permanent``: a bad DDL, which
        every later call reports at once) or :class:`WriteAbandoned`."""
        if self.ddl is None:
            return None
        if self._permanent_error is not None:
            raise CommitFailed(self._permanent_error, permanent=True)
        return self._retrying(lambda: self._ddl_schema(self._session()), "parsing the schema")

    def next_stamp(self) -> datetime:
        """A commit's identity: its ``ingested_at``, unique and increasing per sink."""
        stamp = max(datetime.now(UTC), self._last_stamp + timedelta(microseconds=1))
        self._last_stamp = stamp
        return stamp

    def commit_files(self, batcher: str, files: Sequence[str], schema: pa.Schema,
                     rows: int | None = None, stamp: datetime | None = None,
                     stamped: bool = False) -> datetime:
        """One Spark job appending the staged Parquet ``files`` (all in ``schema``: the
        data columns + ``message_id``) to the dataset, with ``ingested_at`` set to the
        commit's stamp (unique per commit of this sink, returned).  ``stamped``: the
        files carry that ``ingested_at`` column already (``stamp`` is then required;
        :meth:`.StagingDir.merge` says why that is cheaper for Spark).

        Retried on transient errors within ``write_retry_seconds``; raises
        :class:`CommitFailed` or :class:`WriteAbandoned`; returns only once Spark reported
        the job committed."""
        dataset = self.dataset_path(batcher)
        if self._permanent_error is not None:
            raise CommitFailed(self._permanent_error, permanent=True)
        if stamped and stamp is None:
            raise ValueError("stamped files need their stamp")
        stamp = stamp or self.next_stamp()
        read_schema = from_arrow_schema(schema)
        attempts = [0]

        def attempt() -> None:
            attempts[0] += 1
            self._attempt(dataset, list(files), read_schema, stamp, again=attempts[0] > 1,
                          stamped=stamped)

        self._retrying(attempt, f"writing {dataset}")
        self.stats["writes"] += 1
        if rows is not None:
            self.stats["rows"] += rows
        return stamp

    def commit(self, batcher: str, table: pa.Table) -> None:
        """Stage ``table`` (data columns + ``message_id``) and commit it alone."""
        staging = StagingDir(os.path.join(self.staging, batcher))
        name = f"{self.writer_id}-{uuid.uuid4().hex}.parquet"
        staging.write(table, name)
        try:
            self.commit_files(batcher, [staging.spark_uri(name)], table.schema, len(table))
        finally:
            staging.remove([name])

    def write(self, batcher: str, messages: list[Message]) -> None:
        """Convert and commit in one go (one process, no committer): one row per healthy
        message; the others are marked ``failed`` with a reason.

        Raises :class:`WriteAbandoned` (and marks nothing) when ``should_stop()`` turns true
        while a failed attempt waits for the next one."""
        self.dataset_path(batcher)   # checks the name
        todo = [m for m in messages if m.status is None]
        if not todo:
            return
        try:
            schema = self.data_schema()
        except CommitFailed as exc:
            self._fail(todo, exc.reason)
            return
        if schema is None:
            schema = self._inferred.get(batcher)
        rows = convert(todo, schema, self.partition_by)
        if schema is None and rows.schema is not None:
            self._inferred[batcher] = rows.schema
        if rows.failed:
            self.stats["failed_rows"] += len(rows.failed)
            log.warning("%d of %d message(s) cannot be rows; e.g. %s",
                        len(rows.failed), len(todo), rows.failed[0].status)
        if rows.table is None:
            return
        try:
            self.commit(batcher, rows.table)
        except CommitFailed as exc:
            self._fail(rows.written, exc.reason)

    # -- internals ---------------------------------------------------------------------------
    def _fail(self, messages: list[Message], reason: str) -> None:
        for m in messages:
            m.status = reason
        self.stats["failed_batches"] += 1
        self.stats["failed_rows"] += len(messages)
        log.error("%d message(s) failed: %s", len(messages), reason)

    def _attempt(self, dataset: str, files: list[str], read_schema: StructType,
                 stamp: datetime, again: bool = False, stamped: bool = False) -> None:
        """One try.  ``again``: an earlier try of this very commit failed, maybe after
        Spark committed some of it (a job interrupted in its commit, a call timed out after
        the job ended): the rows already there with its stamp are left out."""
        try:
            spark = self._session()

            def run() -> None:
                if stamped:   # the same plan every job: Spark's generated code is reused
                    df = spark.read.schema(StructType([
                        *read_schema.fields, StructField("ingested_at", TimestampType())])
                    ).parquet(*files)
                else:
                    df = spark.read.schema(read_schema).parquet(*files) \
                        .withColumn("ingested_at", F.lit(stamp))
                if again:
                    try:
                        there = self._rows_stamped(spark, dataset, [stamp]) \
                            .select("message_id")
                        if there.limit(1).count():
                            df = df.join(there, "message_id", "left_anti") \
                                .select(*read_schema.names, "ingested_at")
                    except AnalysisException as exc:
                        if not missing(exc):
                            raise
                # version 2: a task's files land in the dataset when the task commits, so
                # a job killed midway (the JVM SIGKILLed) leaves its committed tasks'
                # rows visible under its stamp, where the next committer finds them
                # (spark_once), instead of in _temporary/0/task_* for the next job's
                # commit to merge after that check (version 1)
                writer = df.write.mode("append").format(self.format) \
                    .option("mapreduce.fileoutputcommitter.algorithm.version", "2")
                if self.partition_by:
                    writer = writer.partitionBy(*self.partition_by)
                if self.options:
                    writer = writer.options(**self.options)
                if self.table:   # created by the first write, in Spark's catalog
                    if self.evolve:
                        self._add_columns(spark, dataset, read_schema)
                    writer.saveAsTable(dataset)
                else:
                    writer.save(dataset)

            with self._dataset_lock(dataset):
                self._call(run)
        except Exception as exc:
            if isinstance(exc, PERMANENT):
                raise Permanent(f"spark: Spark rejected the batch: {one_line(exc)}") from exc
            if transient(exc):
                self._drop_session()
            raise

    def _add_columns(self, spark: SparkSession, table: str, schema: StructType) -> None:
        """``schema = "evolve"``: the columns ``schema`` has that the table has not are
        added to its catalog entry first (an append by name then fills them); nothing
        when the table does not exist yet (the append creates it)."""
        from .spark_evolve import add_columns_sql

        try:
            have = set(spark.table(table).columns)
        except AnalysisException as exc:
            if missing(exc):
                return
            raise
        new = [f for f in schema.fields if f.name not in have]
        if new:
            arrow = to_arrow_schema(StructType(new), timezone="UTC")
            spark.sql(add_columns_sql(table, list(arrow)))
            log.info("spark: added column(s) %s to table %s (schema = \"evolve\")",
                     ", ".join(f.name for f in new), table)

    @contextlib.contextmanager
    def _dataset_lock(self, dataset: str) -> Iterator[None]:
        """One Spark job at a time per dataset among the writers that share this staging
        area (a committer and anything else writing with :meth:`write`): an ``flock`` on
        ``<staging>/locks/<hash of the dataset>.lock``, released by the kernel if the
        holder dies.  Waited for with heartbeats; skipped for a staging area that is not
        a local path (one committer per dataset is the rule there)."""
        if "://" in self.staging and not self.staging.startswith("file://"):
            yield
            return
        root = self.staging.removeprefix("file://")
        os.makedirs(os.path.join(root, "locks"), exist_ok=True)
        name = hashlib.sha1(dataset.encode()).hexdigest()[:20]
        fd = os.open(os.path.join(root, "locks", f"{name}.lock"), os.O_RDWR | os.O_CREAT,
                     0o600)
        try:
            last = time.monotonic()
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if self.should_stop():
                        raise WriteAbandoned("stopping while waiting for the dataset") \
                            from None
                    if time.monotonic() - last >= 1.0:
                        self.on_wait()
                        last = time.monotonic()
                    time.sleep(0.02)
            yield
        finally:
            os.close(fd)   # releases the lock

    def _ddl_schema(self, spark: SparkSession) -> pa.Schema:
        if self._arrow_schema is None:
            assert self.ddl is not None
            try:
                parsed = self._call(lambda: spark.createDataFrame([], schema=self.ddl).schema)
            except PERMANENT as exc:
                raise Permanent(f"spark: the schema is not valid DDL: {one_line(exc)}",
                                 sticky=True) from exc
            try:
                arrow = ddl_fields_to_arrow(parsed, self.partition_by)
            except SchemaProblem as exc:
                raise Permanent(exc.reason, sticky=True) from exc
            self._spark_schema = StructType([
                *parsed.fields,
                StructField("message_id", StringType(), False),
                StructField("ingested_at", TimestampType(), False)])
            self._arrow_schema = arrow
        return self._arrow_schema
