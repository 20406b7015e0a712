"""The Spark sink of a batch processor: one batch in, rows committed (or messages failed).

Imported only by batch processors that write to Spark: it pulls in pyspark's Connect
client (pandas, pyarrow, grpc: ~135 MB, ~0.8 s), which no other stage should pay for.

Where it connects
    ``remote`` (``sc://host:port``) from the settings, else the environment variable
    ``OFFBROADWAY_SPARK_REMOTE`` (the daemon sets it to the *current* local server
    incarnation at every batch-processor start).  ``sc://127.0.0.1:…`` and
    ``sc://[::1]:…`` are rewritten to ``sc://localhost:…``: pyspark speaks plaintext over
    loopback only for the literal host ``localhost`` and otherwise insists on TLS as soon as
    a token is set (``127.0.0.1`` with a token hangs in a TLS handshake).

Where the token comes from (first that applies; it is never logged, never in a URL)
    1. ``token_file``: a file holding the token (re-read at every new session, so a
       rotated credential is picked up on the next reconnect);
    2. ``token_env``: the name of an environment variable holding it;
    3. ``OFFBROADWAY_SPARK_TOKEN`` (what the daemon hands each batch processor for the
       local server);
    4. none (a server without authentication).

What lands where
    ``<output>/<batcher>/writer=<writer_id>-<stamp>-<rand>/[<partition_by>=…/]part-….parquet``
    with one row per message: the fields of ``message.data`` (a mapping) plus
    ``message_id`` (string) and ``ingested_at`` (UTC timestamp of the write).  Read the
    whole output back as one dataset, e.g. ``spark.read.parquet("<output>/<batcher>")``:
    Spark discovers ``writer`` (and any ``partition_by`` columns) as partition columns.

Why a directory per writer incarnation (measured, see docs/design-spark.md)
    Two Spark jobs appending into one directory share its ``_temporary`` and each job's
    commit deletes it: two writers x 80 appends of 1000 rows into one directory kept
    141,500 of the 142,000 rows whose writes *reported success* (silent loss), and 18 of
    160 writes failed outright.  With a directory per writer: 160,000 of 160,000, no
    errors.  The directory name also changes whenever a write attempt fails or is
    abandoned (and at every process start), because a job we lost track of (a client
    killed mid-write, a timed-out RPC) keeps running in the server and must never share a
    directory with a new job.  Such a zombie job may still commit: that is a duplicate
    row, never a lost one (at-least-once; dedupe on ``message_id``).

Schema
    ``schema`` is a Spark DDL string (``"seq BIGINT, payload STRING, at TIMESTAMP"``),
    parsed by the server at the first write; else the schema is inferred from the first
    batch of each batcher (Arrow's inference; all-null columns become strings) and kept
    for the life of this sink.  A message fails, alone, with a reason naming the field
    when its data is not a mapping, has a key outside the schema, a value of the wrong
    type (integers widen to floats/decimals; strings parse into timestamps/dates; a float
    never truncates into an integer), or a null in a ``NOT NULL`` column.  ``message_id``
    and ``ingested_at`` are reserved.  Declare ``schema`` for types that must not drift
    between writers and restarts.  Nested values (struct/array/map) use Arrow's own
    conversion, which ignores unknown keys inside a struct.

Faults
    The Spark call runs in a helper thread while this thread calls ``on_wait()`` (the
    batch processor's heartbeat) every second, so a long write does not trip the
    supervisor's watchdog.  Transient failures (Connect unreachable, gRPC UNAVAILABLE,
    a lost session, a failed Spark job) are retried with exponential backoff and jitter
    (tenacity) for up to ``write_retry_seconds``; a batch that still fails, or one that
    Spark rejects outright (analysis errors, a bad DDL), marks every message with a
    reason.  ``write`` never raises for data or Spark problems, and no message keeps
    ``status = None`` unless its row was committed by a job that reported success.
    A single Spark call that runs past ``write_timeout`` (default 600 s) is abandoned
    (its channel closed) and counts as a failed attempt.  Duplicates can only come from
    a write whose outcome is unknown (connection lost mid-write, timeout, server killed
    mid-commit): the retry goes to a fresh directory, so nothing is lost, and every row
    carries its ``message_id`` for ``dropDuplicates(["message_id"])``.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import threading
import time
import warnings
import weakref
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit, urlunsplit

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

from .redact import mask_url

__all__ = ["ENV_REMOTE", "ENV_TOKEN", "FORMATS", "RESERVED", "WRITER_COLUMN", "SparkSink",
           "WriteAbandoned"]

log = logging.getLogger("offbroadway.spark_sink")
# pyspark warns each time its (deliberately short) client retry policy gives up; our own
# retry loop logs every failed attempt with its reason instead.
warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]")

ENV_REMOTE = "OFFBROADWAY_SPARK_REMOTE"
ENV_TOKEN = "OFFBROADWAY_SPARK_TOKEN"
FORMATS = ("parquet", "json", "orc")
RESERVED = ("message_id", "ingested_at")
WRITER_COLUMN = "writer"
INGESTED_TYPE = pa.timestamp("us", tz="UTC")
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


def normalize_remote(remote: str) -> str:
    """``sc://127.0.0.1:P`` → ``sc://localhost:P`` (see the module docstring)."""
    parts = urlsplit(remote)
    if parts.scheme != "sc" or not parts.hostname:
        raise ValueError(f"Spark Connect remote must look like sc://host:port, "
                         f"got {mask_url(remote)!r}")
    if parts.hostname in ("127.0.0.1", "::1"):
        netloc = "localhost" + (f":{parts.port}" if parts.port else "")
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return remote


# -- Arrow conversion --------------------------------------------------------------------

def _nested(t: pa.DataType) -> bool:
    return (pa.types.is_struct(t) or pa.types.is_list(t) or pa.types.is_large_list(t)
            or pa.types.is_map(t) or pa.types.is_fixed_size_list(t))


def _castable(src: pa.DataType, dst: pa.DataType) -> bool:
    """The conversions a value may take on its way into a declared column.

    Arrow would cast far more (int→string, "1"→int, and from Python a float silently
    truncates into an int64): accepting those would store something other than what the
    producer sent, so they fail the message instead.
    """
    T = pa.types
    if src == dst or T.is_null(src):
        return True
    if T.is_integer(src):
        return T.is_integer(dst) or T.is_floating(dst) or T.is_decimal(dst)
    if T.is_floating(src):   # a safe cast: 2.0 → 2 passes, 2.5 → int fails
        return T.is_floating(dst) or T.is_integer(dst) or T.is_decimal(dst)
    if T.is_decimal(src):
        return T.is_decimal(dst) or T.is_floating(dst)
    if T.is_string(src) or T.is_large_string(src):
        return (T.is_string(dst) or T.is_large_string(dst) or T.is_timestamp(dst)
                or T.is_date(dst) or T.is_decimal(dst))
    if T.is_binary(src) or T.is_large_binary(src):
        return T.is_binary(dst) or T.is_large_binary(dst)
    if T.is_timestamp(src) or T.is_date(src):
        return T.is_timestamp(dst) or T.is_date(dst)
    return False


def _convert(values: list, field: pa.Field) -> pa.Array:
    """One column, strictly (see :func:`_castable`); raises on any value that does not fit."""
    dst = field.type
    if _nested(dst):
        arr = pa.array(values, type=dst)
    else:
        arr = pa.array(values)          # Arrow's inference: mixed Python types raise here
        if arr.type != dst:
            if not _castable(arr.type, dst):
                raise TypeError(f"expected {dst}, got {arr.type}")
            if pa.types.is_string(arr.type) and pa.types.is_timestamp(dst) and dst.tz:
                try:
                    arr = arr.cast(dst)
                except pa.ArrowInvalid:  # no offset in the text: read it as UTC
                    arr = arr.cast(pa.timestamp(dst.unit)).cast(dst)
            else:
                arr = arr.cast(dst)
    if not field.nullable and arr.null_count:
        raise ValueError("is NOT NULL but the value is missing or null")
    return arr


_CONVERT_ERRORS = (pa.ArrowException, TypeError, ValueError, OverflowError)


def infer_schema(rows: Sequence[Mapping[str, Any]]) -> pa.Schema:
    """Columns in first-seen order, typed by Arrow's inference over the whole batch.

    A column whose values disagree takes the type of its first value that converts (the
    others then fail their messages); an all-null column becomes a string.
    """
    names: dict[str, None] = {}
    for row in rows:
        for key in row:
            names.setdefault(key, None)
    fields = []
    for name in names:
        values = [row.get(name) for row in rows]
        try:
            t = pa.array(values).type
        except _CONVERT_ERRORS:
            t = pa.null()
            for v in values:
                if v is None:
                    continue
                try:
                    t = pa.array([v]).type
                    break
                except _CONVERT_ERRORS:
                    continue
        if pa.types.is_null(t):
            t = pa.string()
        fields.append(pa.field(name, t))
    return pa.schema(fields)


def rows_to_table(schema: pa.Schema, rows: list[Mapping[str, Any]]
                  ) -> tuple[dict[str, pa.Array], dict[int, str]]:
    """Columns for the rows that fit ``schema``, and ``{row index: reason}`` for the rest.

    Fast path: one ``pa.array`` per column.  Only a column that fails is converted value by
    value to find the culprits, which are then dropped from every column and the columns
    rebuilt, so one bad row costs the batch one slow pass, not the batch.
    """
    bad: dict[int, str] = {}
    known = set(schema.names)
    for i, row in enumerate(rows):
        extra = [k for k in row if k not in known]
        if extra:
            bad[i] = (f"field {extra[0]!r} is not in the schema "
                      f"({', '.join(schema.names) or 'no columns'})")
    while True:
        keep = [i for i in range(len(rows)) if i not in bad]
        columns: dict[str, pa.Array] = {}
        new_bad = False
        for field in schema:
            values = [rows[i].get(field.name) for i in keep]
            try:
                columns[field.name] = _convert(values, field)
                continue
            except _CONVERT_ERRORS:
                pass
            pieces = []
            for i, v in zip(keep, values):
                try:
                    pieces.append(_convert([v], field))
                except _CONVERT_ERRORS as exc:
                    bad[i] = f"field {field.name!r} does not fit the schema: {exc}"
                    new_bad = True
            if new_bad:
                break   # drop the culprits from every column and rebuild
            # every value fits on its own (say, timestamps in two text styles): keep them
            columns[field.name] = pa.concat_arrays(pieces) if pieces else \
                pa.array([], field.type)
        if not new_bad:
            return columns, bad


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


class SparkSink:
    """Writes batches through one Spark Connect session (see the module docstring)."""

    def __init__(self, *, remote: str | None = None, output: str, format: str = "parquet",
                 partition_by: Sequence[str] = (), schema: str | None = None,
                 writer_id: str, on_wait: Callable[[], None] = lambda: None,
                 should_stop: Callable[[], bool] = lambda: False,
                 token_env: str | None = None, token_file: str | None = None,
                 write_retry_seconds: float = 60.0, write_timeout: float = 600.0,
                 **options: Any) -> None:
        remote = remote or os.environ.get(ENV_REMOTE)
        if not remote:
            raise ValueError(f"SparkSink needs remote= or {ENV_REMOTE} in the environment")
        if format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
        if not output:
            raise ValueError("output is required")
        if not _SAFE_NAME.match(writer_id):
            raise ValueError(f"writer_id {writer_id!r} is not a safe directory name")
        for col in partition_by:
            if col in RESERVED or col == WRITER_COLUMN:
                raise ValueError(f"partition_by cannot use the reserved column {col!r}")
        self.remote = normalize_remote(remote)
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
        self._rotate()
        self.stats = {"writes": 0, "rows": 0, "retries": 0, "failed_batches": 0,
                      "failed_rows": 0}
        _open_sinks.add(self)

    # -- public ----------------------------------------------------------------------------
    def writer_path(self, batcher: str) -> str:
        """Where this sink's next write for ``batcher`` goes (changes after any failure)."""
        return f"{self.output}/{batcher}/{WRITER_COLUMN}={self.writer_dir}"

    def write(self, batcher: str, messages: list[Message]) -> None:
        """Commit one row per healthy message; mark the others ``failed`` with a reason.

        Raises :class:`WriteAbandoned` (and marks nothing) when ``should_stop()`` turns true
        while a failed attempt waits for the next one."""
        if not _SAFE_NAME.match(batcher):
            raise ValueError(f"batcher {batcher!r} is not a safe directory name")
        todo: list[Message] = []
        for m in messages:
            if m.status is not None:
                continue
            if not isinstance(m.data, Mapping):
                m.status = f"spark: message data is a {type(m.data).__name__}, not a mapping"
            elif any(not isinstance(k, str) for k in m.data):
                m.status = "spark: message data has a key that is not a string"
            elif any(k in m.data for k in RESERVED):
                hit = next(k for k in RESERVED if k in m.data)
                m.status = f"spark: message data uses the reserved column {hit!r}"
            else:
                todo.append(m)
        if not todo:
            return
        if self._permanent_error is not None:
            self._fail(todo, self._permanent_error)
            return
        batch: dict[str, Any] = {"table": None, "rows": todo}
        t0 = time.monotonic()
        attempts = 0

        def attempt() -> None:
            nonlocal attempts
            attempts += 1
            self._attempt(batcher, batch)

        try:
            tenacity.Retrying(
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
            self._fail(batch["rows"], str(exc))
            return
        except Exception as exc:
            took = time.monotonic() - t0
            if transient(exc):
                reason = (f"spark: write failed after {attempts} attempt(s) over {took:.0f} s "
                          f"(retry bound {self.write_retry_seconds:.0f} s): {_one_line(exc)}")
            else:
                reason = f"spark: write failed: {_one_line(exc)}"
                log.exception("Spark write to %s failed", self.writer_path(batcher))
            self._fail(batch["rows"], reason)
            return
        n = len(batch["rows"])
        self.stats["writes"] += 1
        self.stats["rows"] += n

    def close(self) -> None:
        """Release the server-side session (best effort; call at stage teardown)."""
        spark, self._spark = self._spark, None
        if spark is not None:
            try:
                spark.stop()
            except Exception:
                pass

    # -- internals ---------------------------------------------------------------------------
    def _rotate(self) -> None:
        """A fresh directory name: no job we lost track of may share it (module docstring)."""
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        self.writer_dir = f"{self.writer_id}-{stamp}-{os.urandom(3).hex()}"

    def _fail(self, messages: list[Message], reason: str) -> None:
        for m in messages:
            m.status = reason
        self.stats["failed_batches"] += 1
        self.stats["failed_rows"] += len(messages)
        log.error("%d message(s) failed: %s", len(messages), reason)

    def _token(self) -> str | None:
        if self.token_file:
            return Path(self.token_file).read_text().strip() or None
        if self.token_env:
            return os.environ.get(self.token_env) or None
        return os.environ.get(ENV_TOKEN) or None

    def _session(self) -> SparkSession:
        if self._spark is None:
            builder = DefaultChannelBuilder(self.remote)
            token = self._token()
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

    def _attempt(self, batcher: str, batch: dict[str, Any]) -> None:
        try:
            spark = self._session()
            if batch["table"] is None:
                batch["table"] = self._build(spark, batcher, batch)
                if batch["table"] is None:
                    return   # every row failed conversion: nothing to write
            table: pa.Table = batch["table"]
            path = self.writer_path(batcher)

            def run() -> None:
                df = spark.createDataFrame(table, schema=self._spark_schema) \
                    if self._spark_schema is not None else spark.createDataFrame(table)
                writer = df.write.mode("append").format(self.format)
                if self.partition_by:
                    writer = writer.partitionBy(*self.partition_by)
                if self.options:
                    writer = writer.options(**self.options)
                writer.save(path)

            self._call(run)
        except (_Permanent, _Timeout):
            self._rotate()
            raise
        except Exception as exc:
            # Whatever happened, a job we no longer track may still run: new directory.
            self._rotate()
            if isinstance(exc, _PERMANENT):
                raise _Permanent(f"spark: Spark rejected the batch: {_one_line(exc)}") from exc
            if transient(exc):
                self._drop_session()
            raise

    def _build(self, spark: SparkSession, batcher: str, batch: dict[str, Any]) -> pa.Table | None:
        """The batch as an Arrow table; messages that do not fit are failed here."""
        messages: list[Message] = batch["rows"]
        if self.ddl is not None:
            schema = self._ddl_schema(spark)
        else:
            schema = self._inferred.get(batcher)
            if schema is None:
                schema = infer_schema([m.data for m in messages])
                self._check_partition_columns(schema.names, "the inferred schema")
                self._inferred[batcher] = schema
        columns, bad = rows_to_table(schema, [m.data for m in messages])
        if bad:
            for i, reason in bad.items():
                messages[i].status = f"spark: {reason}"
            self.stats["failed_rows"] += len(bad)
            log.warning("%d of %d message(s) do not fit the schema; e.g. %s",
                        len(bad), len(messages), next(iter(bad.values())))
            messages = [m for i, m in enumerate(messages) if i not in bad]
            batch["rows"] = messages
        if not messages:
            return None
        now = datetime.now(UTC)
        columns["message_id"] = pa.array([str(m.id) for m in messages], pa.string())
        columns["ingested_at"] = pa.repeat(pa.scalar(now, INGESTED_TYPE), len(messages))
        return pa.table(columns)

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
            hit = [n for n in names if n in RESERVED or n == WRITER_COLUMN]
            if hit:
                raise _Permanent(f"spark: the schema declares the reserved column {hit[0]!r}",
                                 sticky=True)
            self._check_partition_columns(names, "the schema", sticky=True)
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

    def _check_partition_columns(self, names: Sequence[str], what: str, *,
                                 sticky: bool = False) -> None:
        missing = [c for c in self.partition_by if c not in names]
        if missing:
            raise _Permanent(f"spark: partition_by column {missing[0]!r} is not in {what}",
                             sticky=sticky)

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
