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
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import logging
import os
import re
import tempfile
import threading
import time
import uuid
import warnings
import weakref
from datetime import UTC, datetime, timedelta
from typing import Any, Callable, Iterator, Sequence

import grpc
import pyarrow as pa
import tenacity
from offbroadway import Message
from pyspark.errors.exceptions.connect import (
    AnalysisException,
    ArithmeticException,
    DateTimeException,
    IllegalArgumentException,
    SparkConnectGrpcException,
    UnsupportedOperationException,
)
from pyspark.sql.connect import functions as F
from pyspark.sql.connect.client import DefaultChannelBuilder
from pyspark.sql.connect.client.retries import DefaultPolicy
from pyspark.sql.connect.session import SparkSession
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

from ..runtime.redact import mask_url
from . import spark_remote
from .spark_rows import RESERVED, convert
from .spark_schema import SchemaProblem, ddl_fields_to_arrow
from .spark_staging import StagingDir

__all__ = ["FORMATS", "RESERVED", "SESSION_CONF", "CommitFailed", "SparkSink",
           "WriteAbandoned"]

log = logging.getLogger("offbroadway.spark_sink")
# pyspark warns each time its (deliberately short) client retry policy gives up; our own
# retry loop logs every failed attempt with its reason instead.
warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]")

FORMATS = ("parquet", "json", "orc")
#: Set on every session (runtime SQL properties, so they hold on a remote server too):
#: ``ingested_at`` in UTC; timestamps as Parquet TIMESTAMP (microseconds), not the legacy
#: INT96 Spark writes by default; a group of up to thousands of staged files listed by
#: the driver (above the default 32 paths Spark starts a listing *job*: ~0.1 s more).
SESSION_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
}
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: Seconds a Spark call (or the session's release) may still run once the owner stops:
#: well inside the committer's shutdown budget (at least 10 s), long enough for a job
#: that was about to end to end.
STOP_GRACE = 3.0

#: Errors that say "this plan/data is wrong": retrying cannot help.
_PERMANENT = (AnalysisException, IllegalArgumentException, UnsupportedOperationException,
              ArithmeticException, DateTimeException)


class WriteAbandoned(Exception):
    """The owner is stopping (``should_stop()``) while a write was backing off between
    attempts: the batch is neither committed nor failed, so its messages must stay unacked
    and be delivered again.  Without this, a batch processor told to stop while Spark is
    down kept retrying until SIGKILL at its shutdown deadline: after a crash of the local
    Spark server that held the whole rest_for_one restart up for max(10 s,
    shutdown_timeout) per batch processor, and every retry went to the dead incarnation's
    port and token, so it could never succeed (found by bench/chaos.py)."""


class _Permanent(Exception):
    """A failure that no retry can fix.  ``sticky``: every later batch would fail the same
    way (a bad DDL, a partition column outside the declared schema), so they fail at once
    without asking the server again."""

    def __init__(self, reason: str, *, sticky: bool = False) -> None:
        super().__init__(reason)
        self.sticky = sticky


class _Timeout(Exception):
    """A Spark call ran past ``write_timeout``; it was abandoned (its channel closed)."""


_GRPC_FIELD = re.compile(r'^\s*(status|details)\s*=\s*"?(.*?)"?\s*$')


def _one_line(exc: BaseException, limit: int = 300) -> str:
    """A reason fit for a message status and one log line.

    A raw gRPC error prints as ``<_InactiveRpcError of RPC that terminated with:`` and the
    useful part on later lines: keep its status code and details instead.
    """
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else ""
    if first.startswith("<_") and "RPC" in first:
        found = dict(m.groups() for m in map(_GRPC_FIELD.match, lines[1:]) if m)
        if found:
            status = found.get("status", "").removeprefix("StatusCode.")
            first = f"{status}: {found.get('details', '')}".strip(": ")
    cause = _root_cause(exc)
    if cause and cause not in first:
        cause = cause[:limit // 2]
        return f"{type(exc).__name__}: {first}"[:limit - len(cause) - 3] + f" ({cause})"
    return f"{type(exc).__name__}: {first}"[:limit]


def _root_cause(exc: BaseException) -> str | None:
    """The deepest cause of a Spark error, from the server's stack trace: Spark says
    "task failed while writing rows", the file system says why (``java.io.IOException:
    No space left on device``), and only the latter tells an operator what to do."""
    get = getattr(exc, "getStackTrace", None)
    trace = get() if callable(get) else None
    if not trace:
        return None
    causes = [line.removeprefix("Caused by: ").strip() for line in trace.splitlines()
              if line.startswith("Caused by: ")]
    return causes[-1] if causes else None


def _missing(exc: BaseException) -> bool:
    """Spark says the dataset (or table) does not exist yet, or holds no data file (a
    first job killed before any task committed leaves only its ``_temporary``)."""
    text = str(exc)
    return any(code in text for code in ("PATH_NOT_FOUND", "TABLE_OR_VIEW_NOT_FOUND",
                                         "UNABLE_TO_INFER_SCHEMA"))


def _session_gone(exc: BaseException) -> bool:
    """The server does not know the session (any more): nothing of it can run."""
    text = str(exc)
    return "SESSION_NOT_FOUND" in text or "SESSION_CLOSED" in text


def transient(exc: BaseException) -> bool:
    """Worth retrying: the server may answer differently in a moment."""
    if isinstance(exc, (_Timeout, OSError, grpc.RpcError)):
        return True
    if isinstance(exc, _PERMANENT):
        return False
    # Everything else the server returned (UNAVAILABLE, session lost or changed,
    # UNAUTHENTICATED after a token rotation, a Spark job aborted by an I/O error…):
    # retried, within the bound.
    return isinstance(exc, SparkConnectGrpcException)


# -- the sink ----------------------------------------------------------------------------

_open_sinks: weakref.WeakSet[SparkSink] = weakref.WeakSet()


@atexit.register
def _close_open_sinks() -> None:
    """Close live sessions before the interpreter tears grpc down.

    Measured: a process that ends with two Connect sessions still open hangs forever in
    ``SparkSession.__del__`` → ``grpc.Channel.close`` during interpreter shutdown.
    """
    for sink in list(_open_sinks):
        sink.close()


class CommitFailed(Exception):
    """A Spark job did not commit.  ``permanent``: retrying the same rows cannot help
    (Spark rejected the plan or data); else the retry bound ran out."""

    def __init__(self, reason: str, *, permanent: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.permanent = permanent


class _ChannelBuilder(DefaultChannelBuilder):
    """pyspark's channel builder, trusting the PEM ``roots`` given (a private CA) instead
    of the bundled ones when the channel is TLS."""

    def __init__(self, url: str, roots: bytes | None) -> None:
        super().__init__(url)
        self._roots = roots

    def toChannel(self) -> grpc.Channel:
        if self._roots is None or not self.use_ssl:
            return super().toChannel()
        creds = grpc.ssl_channel_credentials(root_certificates=self._roots)
        if self.token is not None:
            creds = grpc.composite_channel_credentials(
                creds, grpc.access_token_call_credentials(self.token))
        return self._secure_channel(self.endpoint, creds)


class SparkSink:
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
        if not _SAFE_NAME.match(writer_id):
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
        _open_sinks.add(self)

    # -- public ----------------------------------------------------------------------------
    def dataset_path(self, batcher: str) -> str:
        """The one dataset of ``batcher``: ``spark.read.parquet(<this>)``, or with
        ``table`` the table's name (``spark.table(<this>)``)."""
        if not _SAFE_NAME.match(batcher):
            raise ValueError(f"batcher {batcher!r} is not a safe directory name")
        if self.table:
            return self.table.replace("{batcher}", batcher)
        return f"{self.output}/{batcher}"

    def _read(self, spark: SparkSession, dataset: str) -> Any:
        if self.table:
            return spark.table(dataset)
        reader = spark.read.format(self.format)
        if self.evolve:
            reader = reader.option("mergeSchema", "true")
        return reader.load(dataset)

    def data_schema(self) -> pa.Schema | None:
        """The DDL's data columns as Arrow (parsed by the server, retried like a write), or
        None without a DDL.  Raises :class:`CommitFailed` (``permanent``: a bad DDL, which
        every later call reports at once) or :class:`WriteAbandoned`."""
        if self.ddl is None:
            return None
        if self._permanent_error is not None:
            raise CommitFailed(self._permanent_error, permanent=True)
        return self._retrying(lambda: self._ddl_schema(self._session()), "parsing the schema")

    def existing_schema(self, batcher: str) -> pa.Schema | None:
        """The data columns of the dataset as Spark reads it now (None: no dataset yet):
        the schema the first commit fixed, persisted with the data itself, so a later run
        conforms to it instead of inferring its own (a whole-number price must not write
        ``total`` as BIGINT beside DOUBLE files).  Retried like a write."""
        dataset = self.dataset_path(batcher)

        def query() -> pa.Schema | None:
            found = self._read_query(
                "reading the dataset's schema",
                lambda spark: self._call(lambda: self._read(spark, dataset).schema),
                absent=lambda exc: _missing(exc) or "UNABLE_TO_INFER_SCHEMA" in str(exc))
            if found is None:
                return None
            data = StructType([f for f in found.fields if f.name not in RESERVED])
            return to_arrow_schema(data, timezone="UTC") if data.fields else None

        return self._retrying(query, f"reading the schema of {dataset}")

    def _read_query(self, what: str, run: Callable[[Any], Any],
                    absent: Callable[[AnalysisException], bool]) -> Any:
        """One read of the dataset through the session: None when ``absent`` says the
        dataset is not there yet; any other analysis error is permanent (one line, no
        retry); a transient error drops the session so the retry opens a new one."""
        spark = self._session()
        try:
            return run(spark)
        except AnalysisException as exc:
            if absent(exc):
                return None
            raise _Permanent(f"spark: {what}: {_one_line(exc)}") from exc
        except Exception as exc:
            if transient(exc):
                self._drop_session()
            raise

    def next_stamp(self) -> datetime:
        """A commit's identity: its ``ingested_at``, unique and increasing per sink."""
        stamp = max(datetime.now(UTC), self._last_stamp + timedelta(microseconds=1))
        self._last_stamp = stamp
        return stamp

    def ids_of(self, batcher: str, stamps: Sequence[datetime]) -> pa.Array:
        """The ``message_id``s of the rows committed with these stamps (none when the
        dataset does not exist yet).  Retried like a write; :class:`CommitFailed`."""
        dataset = self.dataset_path(batcher)

        def query() -> pa.Array:
            table = self._read_query(
                "reading the last commits",
                lambda spark: self._call(lambda: self._rows_stamped(spark, dataset, stamps)
                                         .select("message_id").toArrow()),
                absent=_missing)
            if table is None:
                return pa.array([], pa.string())
            return table.column("message_id").combine_chunks()

        return self._retrying(query, f"reading the last commits of {dataset}")

    def ids_present(self, batcher: str, ids: pa.Array) -> pa.Array:
        """Which of ``ids`` the dataset already holds (none when it does not exist yet):
        the check of redelivered messages (spark_once), whenever they come back.  One
        query: the ids go as a local relation, semi-joined with the dataset's
        ``message_id`` column (Spark reads that column only).  Retried like a write;
        :class:`CommitFailed`."""
        dataset = self.dataset_path(batcher)
        probe = pa.table({"message_id": ids.cast(pa.string())})

        def query() -> pa.Array:
            table = self._read_query(
                "looking up redelivered messages",
                lambda spark: self._call(
                    lambda: spark.createDataFrame(probe)
                    .join(self._read(spark, dataset).select("message_id"), "message_id",
                          "left_semi").distinct().toArrow()),
                absent=_missing)
            if table is None:
                return pa.array([], pa.string())
            return table.column("message_id").combine_chunks()

        return self._retrying(query, f"looking up redelivered messages in {dataset}")

    def _rows_stamped(self, spark: SparkSession, dataset: str, stamps: Sequence[datetime]
                      ) -> Any:
        return self._read(spark, dataset).where(F.col("ingested_at").isin(list(stamps)))

    def commit_files(self, batcher: str, files: Sequence[str], schema: pa.Schema,
                     rows: int | None = None, stamp: datetime | None = None) -> datetime:
        """One Spark job appending the staged Parquet ``files`` (all in ``schema``: the
        data columns + ``message_id``) to the dataset, with ``ingested_at`` set to the
        commit's stamp (unique per commit of this sink, returned).

        Retried on transient errors within ``write_retry_seconds``; raises
        :class:`CommitFailed` or :class:`WriteAbandoned`; returns only once Spark reported
        the job committed."""
        dataset = self.dataset_path(batcher)
        if self._permanent_error is not None:
            raise CommitFailed(self._permanent_error, permanent=True)
        stamp = stamp or self.next_stamp()
        read_schema = from_arrow_schema(schema)
        attempts = [0]

        def attempt() -> None:
            attempts[0] += 1
            self._attempt(dataset, list(files), read_schema, stamp, again=attempts[0] > 1)

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

    def close(self) -> None:
        """Release the server-side session (best effort; call at stage teardown), waiting
        at most :data:`STOP_GRACE` seconds for a server that may be gone: after that the
        channel is closed and the server drops the session on its own."""
        spark, self._spark = self._spark, None
        if spark is None:
            return
        done = threading.Event()

        def release() -> None:
            try:
                spark.stop()
            except Exception:
                pass
            finally:
                done.set()

        threading.Thread(target=release, name="spark-close", daemon=True).start()
        if not done.wait(STOP_GRACE):
            try:
                spark.client.close()
            except Exception:
                pass

    # -- internals ---------------------------------------------------------------------------
    def _retrying(self, fn: Callable[[], Any], what: str) -> Any:
        t0 = time.monotonic()
        attempts = 0

        def attempt() -> Any:
            nonlocal attempts
            attempts += 1
            return fn()

        try:
            return tenacity.Retrying(
                retry=tenacity.retry_if_exception(transient),
                stop=tenacity.stop_after_delay(self.write_retry_seconds),
                wait=tenacity.wait_exponential_jitter(multiplier=0.5, max=5.0, jitter=0.5),
                sleep=self._sleep,
                before_sleep=self._before_sleep,
                reraise=True,
            )(attempt)
        except WriteAbandoned:
            raise
        except _Permanent as exc:
            if exc.sticky:
                self._permanent_error = str(exc)
            raise CommitFailed(str(exc), permanent=True) from None
        except Exception as exc:
            took = time.monotonic() - t0
            if transient(exc):
                reason = (f"spark: write failed after {attempts} attempt(s) over {took:.0f} s "
                          f"(retry bound {self.write_retry_seconds:.0f} s): {_one_line(exc)}")
                raise CommitFailed(reason) from None
            log.exception("Spark: %s failed", what)
            raise CommitFailed(f"spark: write failed: {_one_line(exc)}",
                               permanent=True) from None

    def _fail(self, messages: list[Message], reason: str) -> None:
        for m in messages:
            m.status = reason
        self.stats["failed_batches"] += 1
        self.stats["failed_rows"] += len(messages)
        log.error("%d message(s) failed: %s", len(messages), reason)

    def _session(self) -> SparkSession:
        if self._spark is None:
            spark = SparkSession.builder.channelBuilder(self._builder(self.session_id)).create()
            try:
                # pyspark's own policy retries UNAVAILABLE for ~10 minutes without telling
                # us; keep it to quick blips so our bounded, heartbeating loop is in charge.
                spark.client.set_retry_policies([DefaultPolicy(
                    max_retries=3, initial_backoff=100, max_backoff=1000,
                    backoff_multiplier=3.0, jitter=100, min_jitter_threshold=0)])
                # a job whose client is gone is interrupted by the server instead of going
                # on writing behind the back of the next committer (module docstring)
                spark.client.disable_reattachable_execute()
                for key, value in SESSION_CONF.items():
                    spark.conf.set(key, value)
            except BaseException:
                # A client that never became ours must still be closed: pyspark registers
                # an exit hook per client that, for an open one, sends clean-up calls with
                # its retries to a server that may be gone (a committer that tried a dead
                # server spent 6-9 s in its exit, past its shutdown budget).
                try:
                    spark.client.close()
                except Exception:
                    pass
                raise
            self._spark = spark
        return self._spark

    def _builder(self, session_id: str | None) -> DefaultChannelBuilder:
        roots = None
        if self.ca_file:   # read at every connect, like the token: a renewed CA is picked up
            with open(self.ca_file, "rb") as f:
                roots = f.read()
        builder = _ChannelBuilder(self.remote, roots)
        token = spark_remote.token(self.token_file, self.token_env)
        if token:
            builder.set(DefaultChannelBuilder.PARAM_TOKEN, token)
        if session_id:
            builder.set(DefaultChannelBuilder.PARAM_SESSION_ID, session_id)
        if self.use_ssl:
            builder.set(DefaultChannelBuilder.PARAM_USE_SSL, "true")
        return builder

    def probe(self, timeout: float = 2.0) -> str | None:
        """Whether Spark's endpoint answers now: None when a gRPC connection to it comes
        up (TCP, TLS if any, and the server's HTTP/2 settings: through a relay too) within
        ``timeout``, else why not, on one line.  No call, no token sent; ~10 ms when it
        answers.  What ``status`` says while a job waits (a partition leaves the job's own
        call hanging, without an error, for as long as TCP keeps retrying)."""
        channel = self._builder(None).toChannel()
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout)
            return None
        except grpc.FutureTimeoutError:
            return f"no connection to {mask_url(self.remote)} within {timeout:g} s"
        except Exception as exc:
            return _one_line(exc)
        finally:
            channel.close()

    def settle_session(self, session_id: str) -> int:
        """Make sure no operation of the server-side session ``session_id`` (an earlier
        incarnation's, gone) still runs: interrupt them all, then wait, asking the server
        for the session's operations (Spark Connect's ``GetStatus``), until none is running
        or terminating, and release the session.  Returns how many were still live at
        the first look.

        Why: a job of a committer SIGKILLed mid-commit can go on and finish on the
        server after its client is gone (a cluster that did not see the connection drop:
        a partition, a host that died), and its rows must be in the dataset before the
        next incarnation reads its last commits back or looks redelivered messages up;
        otherwise they land after that check, and the redelivered copies are written a
        second time.  An interrupted job ends at its next task boundary, or once its
        commit is done.  Bounded by ``write_timeout``; retried like a write;
        :class:`CommitFailed` if the server cannot tell."""
        from pyspark.sql.connect.client import SparkConnectClient
        from pyspark.sql.connect.proto import base_pb2

        states = base_pb2.GetStatusResponse.OperationStatus
        live_states = {states.OPERATION_STATE_RUNNING, states.OPERATION_STATE_TERMINATING}
        first: list[int] = []

        def settle() -> int:
            client = SparkConnectClient(connection=self._builder(session_id))
            try:
                client.set_retry_policies([DefaultPolicy(
                    max_retries=3, initial_backoff=100, max_backoff=1000,
                    backoff_multiplier=3.0, jitter=100, min_jitter_threshold=0)])
                try:
                    client.interrupt_all()
                except Exception as exc:
                    if _session_gone(exc):   # released, or a server that restarted
                        return 0
                    raise
                deadline = time.monotonic() + self.write_timeout
                while True:
                    found = client._get_operation_statuses()
                    live = [o.operation_id for o in found.operation_statuses
                            if o.state in live_states]
                    if not first:
                        first.append(len(live))
                    if not live:
                        break
                    if time.monotonic() > deadline:
                        raise _Timeout(f"{len(live)} operation(s) of an earlier session "
                                       f"still running after {self.write_timeout:.0f} s")
                    self.on_wait()
                    self._sleep(0.2)
                try:
                    client.release_session()
                except Exception as exc:
                    if not _session_gone(exc):
                        raise
                return first[0]
            finally:
                try:
                    client.close()
                except Exception:
                    pass

        return self._retrying(settle, "waiting for an earlier session's jobs to end")

    def _drop_session(self) -> None:
        """Close the channel (this also cancels an RPC stuck on it) and start afresh later."""
        spark, self._spark = self._spark, None
        if spark is not None:
            try:
                spark.client.close()
            except Exception:
                pass

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` in a helper thread; heartbeat here; give up at ``write_timeout``, or
        :data:`STOP_GRACE` seconds after ``should_stop()`` turned true.

        Why the second bound: a call to a server that died mid-job (or is being restarted
        on the same port) can hang for the whole ``write_timeout``; the owner told to stop
        would then outlive its shutdown budget and be SIGKILLed.  A job still in flight when
        its owner stops is not one the owner will answer anyway (its batches stay unacked,
        and the commit's stamp, journaled before the job, puts its rows in doubt if it did
        commit), so it is abandoned: its channel is closed and the server interrupts it."""
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:
                box["error"] = exc

        thread = threading.Thread(target=target, name="spark-write", daemon=True)
        thread.start()
        now = time.monotonic()
        deadline, beat, stop_at = now + self.write_timeout, now + 1.0, None
        while True:
            thread.join(timeout=0.2)
            if not thread.is_alive():
                break
            now = time.monotonic()
            if now >= beat:
                self.on_wait()
                beat = now + 1.0
            if stop_at is None and self.should_stop():
                stop_at = now + STOP_GRACE
            if stop_at is not None and now >= stop_at:
                self._drop_session()
                raise WriteAbandoned(f"stopping while a Spark call ran (abandoned after "
                                     f"{STOP_GRACE:g} s)")
            if now > deadline:
                self._drop_session()
                raise _Timeout(f"Spark call still running after {self.write_timeout:.0f} s; "
                               "abandoned")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def _attempt(self, dataset: str, files: list[str], read_schema: StructType,
                 stamp: datetime, again: bool = False) -> None:
        """One try.  ``again``: an earlier try of this very commit failed, maybe after
        Spark committed some of it (a job interrupted in its commit, a call timed out after
        the job ended): the rows already there with its stamp are left out."""
        try:
            spark = self._session()

            def run() -> None:
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
                        if not _missing(exc):
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
            if isinstance(exc, _PERMANENT):
                raise _Permanent(f"spark: Spark rejected the batch: {_one_line(exc)}") from exc
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
            if _missing(exc):
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
            except _PERMANENT as exc:
                raise _Permanent(f"spark: the schema is not valid DDL: {_one_line(exc)}",
                                 sticky=True) from exc
            try:
                arrow = ddl_fields_to_arrow(parsed, self.partition_by)
            except SchemaProblem as exc:
                raise _Permanent(exc.reason, sticky=True) from exc
            self._spark_schema = StructType([
                *parsed.fields,
                StructField("message_id", StringType(), False),
                StructField("ingested_at", TimestampType(), False)])
            self._arrow_schema = arrow
        return self._arrow_schema

    def _sleep(self, seconds: float) -> None:
        """tenacity's sleep: heartbeat at least once a second while backing off."""
        deadline = time.monotonic() + seconds
        while True:
            self.on_wait()
            if self.should_stop():
                self._drop_session()   # close() must not wait on a server that is gone
                raise WriteAbandoned("stopping while a Spark write was being retried")
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(0.2, left))

    def _before_sleep(self, state: tenacity.RetryCallState) -> None:
        self.stats["retries"] += 1
        exc = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        log.warning("Spark write attempt %d failed (%s); retrying in %.1f s",
                    state.attempt_number, _one_line(exc) if exc else "?", wait)

