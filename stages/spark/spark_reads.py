"""The reads of a dataset through the sink's session: its path or table, the schema it
has, the ids its last commits wrote, which redelivered ids it holds already.

:class:`DatasetReads` is the part of :class:`.spark_sink.SparkSink` that asks Spark
about what is written (the committer's start and its lookups, docs/design-spark.md §5);
each read is retried like a write and raises :class:`.spark_failures.CommitFailed`.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Callable, Sequence

import pyarrow as pa
from pyspark.errors.exceptions.connect import AnalysisException
from pyspark.sql.connect import functions as F
from pyspark.sql.connect.session import SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from .spark_failures import Permanent, missing, one_line
from .spark_rows import RESERVED
from .spark_session import SparkConnection, transient

__all__ = ["SAFE_NAME", "DatasetReads"]

SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class DatasetReads(SparkConnection):
    """A dataset's reads (see the module docstring); :class:`.spark_sink.SparkSink` sets
    these attributes."""

    output: str
    table: str | None
    format: str
    evolve: bool

    def dataset_path(self, batcher: str) -> str:
        """The one dataset of ``batcher``: ``spark.read.parquet(<this>)``, or with
        ``table`` the table's name (``spark.table(<this>)``)."""
        if not SAFE_NAME.match(batcher):
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
                absent=lambda exc: missing(exc) or "UNABLE_TO_INFER_SCHEMA" in str(exc))
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
            raise Permanent(f"spark: {what}: {one_line(exc)}") from exc
        except Exception as exc:
            if transient(exc):
                self._drop_session()
            raise

    def ids_of(self, batcher: str, stamps: Sequence[datetime]) -> pa.Array:
        """The ``message_id``s of the rows committed with these stamps (none when the
        dataset does not exist yet).  Retried like a write; :class:`CommitFailed`."""
        dataset = self.dataset_path(batcher)
        return self._ids(
            "reading the last commits", f"reading the last commits of {dataset}",
            lambda spark: self._rows_stamped(spark, dataset, stamps).select("message_id"))

    def ids_present(self, batcher: str, ids: pa.Array) -> pa.Array:
        """Which of ``ids`` the dataset already holds (none when it does not exist yet):
        the check of redelivered messages (spark_once), whenever they come back.  One
        query: the ids go as a local relation, semi-joined with the dataset's
        ``message_id`` column (Spark reads that column only).  Retried like a write;
        :class:`CommitFailed`."""
        dataset = self.dataset_path(batcher)
        probe = pa.table({"message_id": ids.cast(pa.string())})
        return self._ids(
            "looking up redelivered messages", f"looking up redelivered messages in {dataset}",
            lambda spark: spark.createDataFrame(probe)
            .join(self._read(spark, dataset).select("message_id"), "message_id", "left_semi")
            .distinct())

    def _ids(self, what: str, retried: str, frame: Callable[[SparkSession], Any]) -> pa.Array:
        """The ``message_id`` column of the DataFrame ``frame`` builds, as one array
        (empty when the dataset is not there yet), retried like a write: the one shape of
        :meth:`ids_of` and :meth:`ids_present`."""

        def query() -> pa.Array:
            table = self._read_query(
                what, lambda spark: self._call(lambda: frame(spark).toArrow()), absent=missing)
            if table is None:
                return pa.array([], pa.string())
            return table.column("message_id").combine_chunks()

        return self._retrying(query, retried)

    def _rows_stamped(self, spark: SparkSession, dataset: str, stamps: Sequence[datetime]
                      ) -> Any:
        return self._read(spark, dataset).where(F.col("ingested_at").isin(list(stamps)))
