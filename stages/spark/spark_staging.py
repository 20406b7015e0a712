"""The staging area: where batch processors leave their batches as Parquet for Spark.

Why (docs/design-spark.md §3): rows become Arrow once, in the batch processor, and
``pq.write_table`` writes them at millions of rows a second in C.  The committer then has
Spark ingest a whole group of staged files in one job (``spark.read.parquet(files)``:
Spark's vectorised reader, parallel tasks; on a cluster the executors read the staging
area themselves), so no row passes through the Spark driver as a local relation and no
Python loop per row runs after the conversion.

The staging area is not the output: only Spark writes the dataset.  It must be a place
both the batch processors and Spark can read: a local directory for the daemon's own
Spark (the default, ``<state_dir>/spark-staging``), or a URI pyarrow and Spark both
understand (``hdfs://…``, a shared mount) for a cluster.  Each batcher stages under
``<root>/<batcher>/``; a file is named ``<batch processor id>-<ref>.parquet``, so a batch
processor's leftovers can be swept by name when it restarts.

A batch holding messages their source marks as possibly delivered before (RabbitMQ's
``redelivered``, a Redis pending entry, a JetStream ``num_delivered`` above 1: the
message's ``metadata["redelivered"]``) is staged as ``<…>-<ref>.again.parquet`` with those
messages' ids in the file's key-value metadata (:data:`AGAIN_KEY`): the committer looks
those ids up in the dataset before writing them (docs/design-spark.md §5), and the name
lets it skip the footer of every other file.

pyarrow only: the batch processors import this, and they never import pyspark.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ..wire.events import flagged
from .spark_rows import INGESTED_TYPE

__all__ = ["INGESTED_AT", "StagingDir", "default_root", "redelivered_ids", "staged_name"]

SUFFIX = ".parquet"
#: the name of a group's files merged by its committer starts so (no stage id does)
MERGED_PREFIX = "group-"
#: the commit's stamp column (its type: :data:`.spark_rows.INGESTED_TYPE`)
INGESTED_AT = "ingested_at"
#: the name's mark of a batch that holds redelivered messages
AGAIN = ".again"
#: the Parquet key-value metadata key listing their ids (JSON)
AGAIN_KEY = b"offbroadway.redelivered"


def staged_name(stage_id: str, ref: int, again: bool = False) -> str:
    """The staged file of batch ``ref`` of batch processor ``stage_id``."""
    return f"{stage_id}-{ref}{AGAIN if again else ''}{SUFFIX}"


def redelivered_ids(messages: Iterable[Any]) -> list[str]:
    """The ids of the messages their source marks as possibly delivered before."""
    return [str(m.id) for m in flagged(list(messages), "redelivered")]


def default_root(state_dir: str) -> str:
    """The staging root of a daemon whose state lives in ``state_dir``."""
    return os.path.join(state_dir, "spark-staging")


class StagingDir:
    """One batcher's staging directory, as a URI both pyarrow and Spark can open."""

    def __init__(self, uri: str) -> None:
        if "://" in uri:
            self.fs, self.path = pafs.FileSystem.from_uri(uri)
            local = isinstance(self.fs, pafs.LocalFileSystem)
        else:
            self.fs, self.path, local = pafs.LocalFileSystem(), os.path.abspath(uri), True
        self.path = self.path.rstrip("/")
        #: what Spark is given: an absolute file URI for a local directory (Spark's
        #: working directory is not ours), else the URI as configured
        self.uri = f"file://{self.path}" if local else uri.rstrip("/")
        self.fs.create_dir(self.path, recursive=True)

    def write(self, table: pa.Table, name: str, again: Sequence[str] = ()) -> None:
        """Write ``table`` as ``name`` (complete once this returns: only then is the name
        handed to the committer).  Timestamps stay microseconds, Spark's precision.
        ``again``: the ids of its redelivered messages, kept in the file's metadata."""
        if again:
            meta = dict(table.schema.metadata or {})
            meta[AGAIN_KEY] = json.dumps(list(again)).encode()
            table = table.replace_schema_metadata(meta)
        pq.write_table(table, f"{self.path}/{name}", filesystem=self.fs,
                       coerce_timestamps="us", allow_truncated_timestamps=False)

    def merge(self, names: Sequence[str], into: str, stamp: datetime) -> str | None:
        """Stage the files ``names`` (one schema: the committer conformed them) again as
        one file ``into``, each as a row group of its own, with the commit's ``stamp`` as
        their ``ingested_at`` column: one file is read at a time, so memory holds one
        batch, not the group.

        Why one file: Spark pays milliseconds of its JVM's CPU per file it reads (a reader
        set up, a footer read, a Hadoop configuration copied), about as much as reading
        10,000 small rows (``bench/spark_files.py``: 4.8 us a row from 10,000-row files,
        3.0 from 200,000-row ones).  Why the stamp in the file: as a literal in the job's
        plan it is a constant in the code Spark generates for the job, different every
        job, so every job compiled its code anew (the JVM's JIT compiler took two thirds
        of its CPU in 20,000-row jobs; 360 ms a job, 180 with the stamp read from the
        file).  Rewriting the group here costs a fraction of that, in C.

        None when ``into`` is written, else why not (a full disk, an unreadable file),
        and ``into`` is not left behind: the committer then has Spark read ``names``."""
        writer = None
        try:
            for name in names:
                table = pq.read_table(f"{self.path}/{name}", filesystem=self.fs)
                table = table.append_column(
                    INGESTED_AT, pa.repeat(pa.scalar(stamp, INGESTED_TYPE), len(table)))
                if writer is None:
                    writer = pq.ParquetWriter(f"{self.path}/{into}", table.schema,
                                              filesystem=self.fs, coerce_timestamps="us",
                                              allow_truncated_timestamps=False)
                writer.write_table(table)
            if writer is None:
                return "no files"
            writer.close()
            return None
        except (OSError, pa.ArrowException, ValueError) as exc:
            if writer is not None:
                with contextlib.suppress(OSError, pa.ArrowException):
                    writer.close()
            self.remove([into])
            return f"{type(exc).__name__}: {exc}"

    def again(self, name: str) -> list[str]:
        """The ids of the redelivered messages of staged file ``name`` (its footer only;
        none unless its name has the mark)."""
        if not name.endswith(AGAIN + SUFFIX):
            return []
        meta = pq.read_schema(f"{self.path}/{name}", filesystem=self.fs).metadata or {}
        raw = meta.get(AGAIN_KEY)
        return [str(i) for i in json.loads(raw)] if raw else []

    def read(self, name: str) -> pa.Table:
        return pq.read_table(f"{self.path}/{name}", filesystem=self.fs)

    def spark_uri(self, name: str) -> str:
        return f"{self.uri}/{name}"

    def names(self, prefix: str = "") -> list[str]:
        infos = self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True))
        return [i.base_name for i in infos
                if i.type == pafs.FileType.File and i.base_name.startswith(prefix)]

    def remove(self, names: Iterable[str]) -> None:
        for name in names:
            try:
                self.fs.delete_file(f"{self.path}/{name}")
            except (FileNotFoundError, OSError):
                pass

    def sweep(self, prefix: str = "", keep: Iterable[str] = ()) -> int:
        """Remove the staged files whose name starts with ``prefix`` except ``keep``: what
        an earlier incarnation left (a Spark job still reading them then fails instead of
        committing rows nobody will acknowledge).  Returns how many were removed."""
        kept = set(keep)
        gone = [n for n in self.names(prefix) if n not in kept]
        self.remove(gone)
        return len(gone)
