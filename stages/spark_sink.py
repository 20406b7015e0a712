"""The Spark side of a dataset: one Spark Connect session that commits Arrow tables.

Used by a batcher's committer (:mod:`.committer`), which groups the batches of all its
batch processors into one Spark job, and by anything that writes batches on its own
(:meth:`SparkSink.write`: convert and commit in one go).  It pulls in pyspark's Connect
client (pandas, pyarrow, grpc: ~135 MB, ~0.8 s), which no other stage should pay for.

Where it connects, with which token
    ``remote`` (``sc://host:port``) from the settings, else what the daemon handed over for
    its own server; the token from ``token_file``, ``token_env`` or the hand-over, read at
    every new session (:mod:`.spark_remote`: the variable names and the rules).

What lands where
    One dataset per batcher: ``<output>/<batcher>/[<partition_by>=…/]part-….parquet``, one
    row per message: the fields of ``message.data`` plus ``message_id`` (string) and
    ``ingested_at`` (UTC timestamp of the commit).  ``spark.read.parquet("<output>/<batcher>")``
    reads it; no column is added by the layout.

How a commit stays safe when jobs overlap (measured, see docs/design-spark.md §4)
    Two Spark jobs appending into one directory share its ``_temporary`` and each job's
    commit deletes it: rows of the other job vanish while its write *reports success*.
    So no job ever writes into the dataset directory: each attempt writes into a staging
    directory of its own, ``<dataset>/_staging/<writer_id>-<uuid>`` (hidden from Spark and
    pyarrow readers by its leading ``_``), and once Spark reported the job committed, its
    part files (named by Spark with the job's UUID) are renamed into the dataset.  A job we
    lost track of (a client killed mid-write, a timed-out RPC) can only ever write into its
    own staging directory, which is never published: its batch is written again by the
    retry (a duplicate only if the rename itself was interrupted; every row carries
    ``message_id`` for ``dropDuplicates(["message_id"])``).  The renames need the output to
    be a filesystem path this process shares with Spark (local, NFS, a mounted volume).

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
import logging
import os
import re
import shutil
import threading
import time
import uuid
import warnings
import weakref
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Callable, Sequence

import grpc
import pyarrow as pa
import tenacity
from offbroadway import Message
from pyspark.errors import PySparkException
from pyspark.errors.exceptions.connect import (
    AnalysisException,
    ArithmeticException,
    DateTimeException,
    IllegalArgumentException,
    SparkConnectGrpcException,
    UnsupportedOperationException,
)
from pyspark.sql.connect.client import DefaultChannelBuilder
from pyspark.sql.connect.client.retries import DefaultPolicy
from pyspark.sql.connect.session import SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

from . import spark_remote
from .spark_rows import INGESTED_TYPE, RESERVED, convert

__all__ = ["FORMATS", "RESERVED", "STAGING", "CommitFailed", "SparkSink", "WriteAbandoned",
           "publish"]

log = logging.getLogger("offbroadway.spark_sink")
# pyspark warns each time its (deliberately short) client retry policy gives up; our own
# retry loop logs every failed attempt with its reason instead.
warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]")

FORMATS = ("parquet", "json", "orc")
#: where each job writes before its files are published into the dataset
STAGING = "_staging"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

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
    return f"{type(exc).__name__}: {first}"[:limit]


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


class SparkSink:
    """Commits Arrow tables through one Spark Connect session (see the module docstring)."""

    def __init__(self, *, remote: str | None = None, output: str, format: str = "parquet",
                 partition_by: Sequence[str] = (), schema: str | None = None,
                 writer_id: str, on_wait: Callable[[], None] = lambda: None,
                 should_stop: Callable[[], bool] = lambda: False,
                 token_env: str | None = None, token_file: str | None = None,
                 write_retry_seconds: float = 60.0, write_timeout: float = 600.0,
                 **options: Any) -> None:
        remote = remote or os.environ.get(spark_remote.ENV_REMOTE)
        if not remote:
            raise ValueError(f"SparkSink needs remote= or {spark_remote.ENV_REMOTE} in the "
                             f"environment")
        if format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
        if not output:
            raise ValueError("output is required")
        if not _SAFE_NAME.match(writer_id):
            raise ValueError(f"writer_id {writer_id!r} is not a safe directory name")
        for col in partition_by:
            if col in RESERVED:
                raise ValueError(f"partition_by cannot use the reserved column {col!r}")
        self.remote = spark_remote.normalize_remote(remote)
        self.output = output.rstrip("/")
        self.format = format
        self.partition_by = tuple(partition_by)
        self.ddl = schema or None
        self.writer_id = writer_id
        self.on_wait = on_wait
        self.should_stop = should_stop
        self.token_env = token_env
        self.token_file = token_file
        self.write_retry_seconds = float(write_retry_seconds)
        self.write_timeout = float(write_timeout)
        self.options = {str(k): str(v) for k, v in options.items()}
        self._spark: SparkSession | None = None
        self._spark_schema: StructType | None = None   # from the DDL, with our columns
        self._arrow_schema: pa.Schema | None = None     # from the DDL, data columns only
        self._inferred: dict[str, pa.Schema] = {}
        self._permanent_error: str | None = None
        self._swept: set[str] = set()
        self.stats = {"writes": 0, "rows": 0, "retries": 0, "failed_batches": 0,
                      "failed_rows": 0}
        _open_sinks.add(self)

    # -- public ----------------------------------------------------------------------------
    def dataset_path(self, batcher: str) -> str:
        """The one dataset of ``batcher``: ``spark.read.parquet(<this>)``."""
        if not _SAFE_NAME.match(batcher):
            raise ValueError(f"batcher {batcher!r} is not a safe directory name")
        return f"{self.output}/{batcher}"

    def data_schema(self) -> pa.Schema | None:
        """The DDL's data columns as Arrow (parsed by the server, retried like a write), or
        None without a DDL.  Raises :class:`CommitFailed` (``permanent``: a bad DDL, which
        every later call reports at once) or :class:`WriteAbandoned`."""
        if self.ddl is None:
            return None
        if self._permanent_error is not None:
            raise CommitFailed(self._permanent_error, permanent=True)
        return self._retrying(lambda: self._ddl_schema(self._session()), "parsing the schema")

    def commit(self, batcher: str, table: pa.Table) -> None:
        """One Spark job appending ``table`` (data columns + ``message_id``) to the dataset.

        The job writes into a staging directory of its own under ``<dataset>/_staging/``
        and the part files are then renamed into the dataset (module docstring).  Retried
        on transient errors within ``write_retry_seconds``; raises :class:`CommitFailed`
        or :class:`WriteAbandoned`; returns only once the rows are in the dataset."""
        dataset = self.dataset_path(batcher)
        if self._permanent_error is not None:
            raise CommitFailed(self._permanent_error, permanent=True)
        self._sweep(dataset)
        table = table.append_column(pa.field("ingested_at", INGESTED_TYPE, nullable=False),
                                    pa.repeat(pa.scalar(datetime.now(UTC), INGESTED_TYPE),
                                              len(table)))
        self._retrying(lambda: self._attempt(dataset, table), f"writing {dataset}")
        self.stats["writes"] += 1
        self.stats["rows"] += len(table)

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
        """Release the server-side session (best effort; call at stage teardown)."""
        spark, self._spark = self._spark, None
        if spark is not None:
            try:
                spark.stop()
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
            builder = DefaultChannelBuilder(self.remote)
            token = spark_remote.token(self.token_file, self.token_env)
            if token:
                builder.set(DefaultChannelBuilder.PARAM_TOKEN, token)
            spark = SparkSession.builder.channelBuilder(builder).create()
            # pyspark's own policy retries UNAVAILABLE for ~10 minutes without telling us;
            # keep it to quick blips so our bounded, heartbeating loop is in charge.
            spark.client.set_retry_policies([DefaultPolicy(
                max_retries=3, initial_backoff=100, max_backoff=1000, backoff_multiplier=3.0,
                jitter=100, min_jitter_threshold=0)])
            self._spark = spark
        return self._spark

    def _drop_session(self) -> None:
        """Close the channel (this also cancels an RPC stuck on it) and start afresh later."""
        spark, self._spark = self._spark, None
        if spark is not None:
            try:
                spark.client.close()
            except Exception:
                pass

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` in a helper thread; heartbeat here; give up at ``write_timeout``."""
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:
                box["error"] = exc

        thread = threading.Thread(target=target, name="spark-write", daemon=True)
        thread.start()
        deadline = time.monotonic() + self.write_timeout
        while True:
            thread.join(timeout=1.0)
            if not thread.is_alive():
                break
            self.on_wait()
            if time.monotonic() > deadline:
                self._drop_session()
                raise _Timeout(f"Spark call still running after {self.write_timeout:.0f} s; "
                               "abandoned")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def _sweep(self, dataset: str) -> None:
        """Once per dataset: remove staging directories an earlier incarnation of this
        writer left (a job it lost track of may still write there; nothing ever reads
        them, and removing them makes such a job fail instead of leaving files)."""
        if dataset in self._swept:
            return
        self._swept.add(dataset)
        staging = Path(dataset) / STAGING
        for old in staging.glob(f"{self.writer_id}-*") if staging.is_dir() else ():
            shutil.rmtree(old, ignore_errors=True)

    def _attempt(self, dataset: str, table: pa.Table) -> None:
        stage = f"{dataset}/{STAGING}/{self.writer_id}-{uuid.uuid4().hex}"
        try:
            spark = self._session()

            def run() -> None:
                df = spark.createDataFrame(table, schema=self._spark_schema) \
                    if self._spark_schema is not None else spark.createDataFrame(table)
                writer = df.write.mode("append").format(self.format)
                if self.partition_by:
                    writer = writer.partitionBy(*self.partition_by)
                if self.options:
                    writer = writer.options(**self.options)
                writer.save(stage)

            self._call(run)
        except Exception as exc:
            # A job we no longer track may still run and write into this staging
            # directory: it is never published; remove what is there now.
            shutil.rmtree(stage, ignore_errors=True)
            if isinstance(exc, _PERMANENT):
                raise _Permanent(f"spark: Spark rejected the batch: {_one_line(exc)}") from exc
            if transient(exc):
                self._drop_session()
            raise
        publish(stage, dataset)

    def _ddl_schema(self, spark: SparkSession) -> pa.Schema:
        if self._arrow_schema is None:
            assert self.ddl is not None
            try:
                parsed = self._call(lambda: spark.createDataFrame([], schema=self.ddl).schema)
            except _PERMANENT as exc:
                raise _Permanent(f"spark: the schema is not valid DDL: {_one_line(exc)}",
                                 sticky=True) from exc
            if not isinstance(parsed, StructType) or not parsed.fields:
                raise _Permanent("spark: the schema DDL does not describe columns", sticky=True)
            names = [f.name for f in parsed.fields]
            hit = [n for n in names if n in RESERVED]
            if hit:
                raise _Permanent(f"spark: the schema declares the reserved column {hit[0]!r}",
                                 sticky=True)
            missing = [c for c in self.partition_by if c not in names]
            if missing:
                raise _Permanent(f"spark: partition_by column {missing[0]!r} is not in the "
                                 f"schema", sticky=True)
            try:
                arrow = to_arrow_schema(parsed, timezone="UTC")
            except (PySparkException, TypeError, ValueError) as exc:
                raise _Permanent(f"spark: the schema has a type Arrow cannot carry: "
                                 f"{_one_line(exc)}", sticky=True) from exc
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


def publish(stage: str, dataset: str) -> int:
    """Move a committed job's data files from its staging directory into the dataset.

    Part files are named by Spark with the job's UUID, so they never collide; each rename
    is atomic on a local or network filesystem.  Hidden files (``_SUCCESS``, ``.crc``) stay
    behind and go with the staging directory.  Returns the number of files moved."""
    moved = 0
    for root, dirs, files in os.walk(stage):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        rel = os.path.relpath(root, stage)
        target = dataset if rel == "." else os.path.join(dataset, rel)
        for name in files:
            if name.startswith(("_", ".")):
                continue
            os.makedirs(target, exist_ok=True)
            os.rename(os.path.join(root, name), os.path.join(target, name))
            moved += 1
    shutil.rmtree(stage, ignore_errors=True)
    return moved
