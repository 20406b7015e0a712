"""The records between a batch processor and its batcher's committer (one definition).

msgpack arrays ``[VERSION, KIND, *fields]`` over the committer's ROUTER socket (the
batch processor connects a DEALER under its stage id).  Rows do not travel here: a batch
processor writes its batch as a Parquet file into the staging area
(:mod:`.spark_staging`) and hands over the file's name; Spark reads the files of a whole
group in one job.

=========  ======================  ======================================================
kind       direction               fields
=========  ======================  ======================================================
HELLO      batch proc → committer  (none): a new incarnation; the committer forgets the
                                   batches of the previous one that no job holds yet and
                                   answers with SCHEMA
SCHEMA     committer → batch proc  schema (Arrow IPC schema bytes, or None: not fixed
                                   yet), error (str or None: every row fails with it, e.g.
                                   a DDL Spark cannot parse), staging (str: the URI of the
                                   directory where this batcher's batches are staged)
COMMIT     batch proc → committer  ref (int), trigger (str), rows (int), file (str: the
                                   staged file's name), schema (the file's Arrow schema,
                                   IPC bytes)
RESULT     committer → batch proc  ref, error (None: the Spark job holding the batch
                                   committed), schema (the dataset's schema, IPC bytes or
                                   None)
=========  ======================  ======================================================
"""

from __future__ import annotations

from typing import Any

import msgpack

VERSION = 2
HELLO = 1
SCHEMA = 2
COMMIT = 3
RESULT = 4
_ARITY = {HELLO: 0, SCHEMA: 3, COMMIT: 5, RESULT: 3}
#: frames carry names and schemas, never rows
MAX_FRAME_BYTES = 16 * 1024 * 1024


class WireError(ValueError):
    """A frame that is not one of ours: counted and dropped by the receiver."""


def _pack(kind: int, *fields: Any) -> bytes:
    return msgpack.packb([VERSION, kind, *fields], use_bin_type=True)


def hello() -> bytes:
    return _pack(HELLO)


def schema(schema_ipc: bytes | None, error: str | None, staging: str) -> bytes:
    return _pack(SCHEMA, schema_ipc, error, staging)


def commit(ref: int, trigger: str, rows: int, file: str, schema_ipc: bytes) -> bytes:
    return _pack(COMMIT, ref, trigger, rows, file, schema_ipc)


def result(ref: int, error: str | None, schema_ipc: bytes | None) -> bytes:
    return _pack(RESULT, ref, error, schema_ipc)


def decode(frame: bytes) -> list:
    """``[kind, *fields]``, or :class:`WireError`."""
    if len(frame) > MAX_FRAME_BYTES:
        raise WireError(f"frame of {len(frame)} bytes is over the limit")
    try:
        msg = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except Exception as exc:   # msgpack raises several unrelated types
        raise WireError(f"not msgpack: {exc}") from None
    if not isinstance(msg, list) or len(msg) < 2 or msg[0] != VERSION:
        raise WireError("not a versioned frame")
    kind = msg[1]
    if _ARITY.get(kind) != len(msg) - 2:
        raise WireError(f"unknown kind or wrong arity: {kind!r}")
    return msg[1:]
