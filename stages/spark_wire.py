"""The records between a batch processor and its batcher's committer (one definition).

msgpack arrays ``[VERSION, KIND, *fields]`` over the committer's ROUTER socket (the
batch processor connects a DEALER under its stage id).  Rows travel as Arrow IPC stream
bytes inside the msgpack frame: Arrow carries every type a row may hold (decimals,
timestamps, nested values) and the committer concatenates tables without touching a row.

=========  ======================  ======================================================
kind       direction               fields
=========  ======================  ======================================================
HELLO      batch proc → committer  (none): a new incarnation; the committer forgets the
                                   batches of the previous one that no job holds yet and
                                   answers with SCHEMA
SCHEMA     committer → batch proc  schema (Arrow IPC schema bytes, or None: not fixed
                                   yet), error (str or None: every row fails with it, e.g.
                                   a DDL Spark cannot parse)
COMMIT     batch proc → committer  ref (int), trigger (str), rows (int), table (IPC bytes)
RESULT     committer → batch proc  ref, error (None: the Spark job holding the batch
                                   committed), schema (the dataset's schema, IPC bytes or
                                   None)
=========  ======================  ======================================================
"""

from __future__ import annotations

from typing import Any

import msgpack

VERSION = 1
HELLO = 1
SCHEMA = 2
COMMIT = 3
RESULT = 4
_ARITY = {HELLO: 0, SCHEMA: 2, COMMIT: 4, RESULT: 3}
#: a COMMIT carries one Broadway batch: 256 MiB is far beyond any sane batch
MAX_FRAME_BYTES = 256 * 1024 * 1024


class WireError(ValueError):
    """A frame that is not one of ours: counted and dropped by the receiver."""


def _pack(kind: int, *fields: Any) -> bytes:
    return msgpack.packb([VERSION, kind, *fields], use_bin_type=True)


def hello() -> bytes:
    return _pack(HELLO)


def schema(schema_ipc: bytes | None, error: str | None) -> bytes:
    return _pack(SCHEMA, schema_ipc, error)


def commit(ref: int, trigger: str, rows: int, table_ipc: bytes) -> bytes:
    return _pack(COMMIT, ref, trigger, rows, table_ipc)


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
