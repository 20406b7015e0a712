"""The Spark hand-off on the wire: a batch processor and its batcher's committer.

Over the committer's ROUTER; the batch processor connects a DEALER under its stage id.
Rows do not travel here: a batch processor writes its batch as a Parquet file into the
staging area (:mod:`..spark.spark_staging`) and hands over the file's name; Spark reads the
files of a whole group in one job.  Frames carry names and schemas, never rows.

=============  ======================  ==================================================
HELLO          batch proc → committer  (none): a new incarnation; the committer forgets
                                       the batches of the previous one that no job holds
                                       yet and answers with SCHEMA
SCHEMA         committer → batch proc  schema (Arrow IPC schema bytes, or None: not fixed
                                       yet), error (str or None: every row fails with it,
                                       e.g. a DDL Spark cannot parse), staging (str: the
                                       URI of the directory where this batcher's batches
                                       are staged)
COMMIT         batch proc → committer  ref (int), trigger (str), rows (int), file (str:
                                       the staged file's name), schema (the file's Arrow
                                       schema, IPC bytes)
RESULT         committer → batch proc  ref, error (None: the Spark job holding the batch
                                       committed), schema (the dataset's schema, IPC
                                       bytes or None)
DRAINED        batch proc → committer  (none): its upstream has finished, no batch comes
                                       after those it handed over (a drain): the
                                       committer need not wait for a group to fill
=============  ======================  ==================================================

The frames' shapes are checked by :func:`.frames.decode`.
"""

from __future__ import annotations

from .frames import COMMIT, DRAINED, HELLO, RESULT, SCHEMA, frame

#: field positions in a decoded frame
SCHEMA_IPC, SCHEMA_ERROR, SCHEMA_STAGING = 1, 2, 3
COMMIT_REF, COMMIT_TRIGGER, COMMIT_ROWS, COMMIT_FILE, COMMIT_SCHEMA = 1, 2, 3, 4, 5
RESULT_REF, RESULT_ERROR, RESULT_SCHEMA = 1, 2, 3


def hello() -> bytes:
    """HELLO: a batch processor's new incarnation, to its committer."""
    return frame(HELLO)


def schema(schema_ipc: bytes | None, error: str | None, staging: str) -> bytes:
    """SCHEMA: the committer's answer to HELLO (see the table above)."""
    return frame(SCHEMA, schema_ipc, error, staging)


def commit(ref: int, trigger: str, rows: int, file: str, schema_ipc: bytes) -> bytes:
    """COMMIT: a staged batch's file, for the committer's next Spark job."""
    return frame(COMMIT, ref, trigger, rows, file, schema_ipc)


def drained() -> bytes:
    """DRAINED: a batch processor hands over nothing more (see the table above)."""
    return frame(DRAINED)


def result(ref: int, error: str | None, schema_ipc: bytes | None) -> bytes:
    """RESULT: how the Spark job holding batch ``ref`` ended (``error`` None: committed)."""
    return frame(RESULT, ref, error, schema_ipc)
