"""Rows → Arrow for the Spark sink: the pure part (no Spark, no sockets, no clock).

A batch processor turns its messages into one Arrow table here and hands the table, as
Arrow IPC bytes, to its batcher's committer (:mod:`.committer`), which groups tables from
all batch processors into one Spark job.  Everything that decides whether a *message* fits
lives here, so a message that breaks the schema fails alone, in the batch processor that
holds it, before anything reaches Spark.

Strictness (why not just ``pa.array(values, type)``)
    Arrow's from-Python conversion is lenient where it matters: ``pa.array([1.5],
    pa.int64())`` gives ``[1]`` and a struct drops unknown keys.  Each column is first
    converted with Arrow's own *inference* (mixed Python types raise) and then cast only
    along a short list of safe conversions (:func:`_castable`).  Only a column that fails
    is redone value by value to find the culprits.

Schema
    A DDL schema is parsed by the server (the committer does that) and arrives here as an
    Arrow schema; without one, the first batch's types are inferred
    (:func:`infer_schema`), and the committer's answer then tells every batch processor
    the dataset's schema (the first table it committed), so all writers of a dataset
    converge on one schema.  :func:`conform` is the committer's check that a table fits
    the dataset.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field as dc_field
from operator import attrgetter, itemgetter
from typing import Any, Sequence

import pyarrow as pa
from offbroadway import Message

from ..wire.events import data_values

#: a message's status and id, read at C speed over a whole batch
_status, _id = attrgetter("status"), attrgetter("id")

__all__ = ["INGESTED_TYPE", "RESERVED", "Rows", "check_data", "conform", "convert",
           "from_ipc", "infer_schema", "rows_to_table", "schema_from_ipc", "schema_to_ipc",
           "to_ipc", "to_table"]

RESERVED = ("message_id", "ingested_at")
INGESTED_TYPE = pa.timestamp("us", tz="UTC")
ID_FIELD = pa.field("message_id", pa.string(), nullable=False)


def check_data(data: Any) -> str | None:
    """Why a message's data cannot be a row at all (``None``: it can)."""
    if not isinstance(data, Mapping):
        return f"spark: message data is a {type(data).__name__}, not a mapping"
    for k in data:
        if not isinstance(k, str):
            return "spark: message data has a key that is not a string"
        if k in RESERVED:
            return f"spark: message data uses the reserved column {k!r}"
    return None


@dataclass
class Rows:
    """What :func:`convert` made of a batch's messages."""

    #: the rows that fit, plus ``message_id`` (None: no row fits)
    table: pa.Table | None
    #: the data columns used: the one given, else inferred (None: none could be)
    schema: pa.Schema | None
    #: the messages whose row is in ``table``, in its order
    written: list[Message] = dc_field(default_factory=list)
    #: the messages failed here, each with its ``status`` (``spark: …``)
    failed: list[Message] = dc_field(default_factory=list)


def convert(messages: Sequence[Message], schema: pa.Schema | None,
            partition_by: Sequence[str] = (), error: str | None = None) -> Rows:
    """A batch's messages → one Arrow table; each message that cannot be a row fails alone.

    Messages already failed (``status`` set) are left out and untouched.  ``schema``: the
    dataset's data columns (a DDL's, or what its committer fixed); None infers them from
    these messages (:func:`infer_schema`).  ``error``: a reason every message fails with
    (a DDL Spark cannot parse).  Used by the batch processor before the hand-over to the
    committer, and by :meth:`.spark_sink.SparkSink.write`.
    """
    if schema is not None and not error and not partition_by:
        fast = _convert_uniform(messages, schema)
        if fast is not None:
            return fast
    todo: list[Message] = []
    failed: list[Message] = []
    # a dict whose keys are all columns of a known schema needs no key-by-key check (the
    # columns are strings and none is reserved): one C-level subset test per message
    known = frozenset(schema.names) if schema is not None and not error else None
    for m in messages:
        if m.status is None:
            data = m.data
            if known is not None and type(data) is dict and data.keys() <= known:
                todo.append(m)
                continue
            m.status = error or check_data(data)
            (failed if m.status is not None else todo).append(m)
    if todo and schema is None:
        schema = infer_schema([m.data for m in todo])
    if schema is not None:
        missing = [c for c in partition_by if c not in schema.names]
        if missing:
            reason = f"spark: partition_by column {missing[0]!r} is not in the schema"
            for m in todo:
                m.status = reason
            return Rows(None, None, [], failed + todo)
    if not todo:
        return Rows(None, schema, [], failed)
    assert schema is not None
    table, bad = to_table(schema, [str(m.id) for m in todo], [m.data for m in todo])
    if bad:
        for i, reason in bad.items():
            todo[i].status = f"spark: {reason}"
        failed += [todo[i] for i in sorted(bad)]
        todo = [m for i, m in enumerate(todo) if i not in bad]
    return Rows(table, schema, todo, failed)



def _convert_uniform(messages: Sequence[Message], schema: pa.Schema) -> Rows | None:
    """The usual batch, with no Python loop per row: every message healthy, its data a
    dict holding exactly the schema's columns.  Checked with C-level ``map``s (types,
    sizes, one ``itemgetter`` per row that raises on a missing key: with the sizes equal,
    no extra key either), the columns transposed by ``zip``, each converted by one
    :func:`_convert`.  None: not such a batch, or a value does not fit; the general path
    then finds which messages fail and why."""
    names = schema.names
    if not names or not messages:
        return None
    if list(map(_status, messages)).count(None) != len(messages):
        return None
    datas = data_values(messages)
    if set(map(type, datas)) != {dict} or set(map(len, datas)) != {len(names)}:
        return None
    try:
        rows = list(map(itemgetter(*names), datas))
    except KeyError:
        return None
    columns = zip(*rows) if len(names) > 1 else [rows]   # one name: the values themselves
    try:
        arrays = [_convert(col, f) for col, f in zip(columns, schema)]
    except _CONVERT_ERRORS:
        return None
    try:
        ids = pa.array(list(map(_id, messages)), pa.string())
    except _CONVERT_ERRORS:   # ids that are not strings (a custom source's ints)
        ids = pa.array([str(m.id) for m in messages], pa.string())
    table = pa.Table.from_arrays([*arrays, ids], schema=pa.schema([*schema, ID_FIELD]))
    return Rows(table, schema, list(messages), [])


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


def _plain(arr: pa.Array, values: Sequence[Any]) -> pa.Array:
    """Arrow's inference, in types Spark reads: a UUID column (Arrow's ``arrow.uuid``
    extension, a Parquet UUID Spark has no type for) becomes its text form."""
    if isinstance(arr.type, pa.BaseExtensionType):
        return pa.array([None if v is None else str(v) for v in values], pa.string())
    return arr


def _convert(values: Sequence[Any], field: pa.Field) -> pa.Array:
    """One column, strictly (see :func:`_castable`); raises on any value that does not fit."""
    dst = field.type
    if _nested(dst):
        arr = pa.array(values, type=dst)
    else:
        arr = _plain(pa.array(values), values)   # inference: mixed Python types raise
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
    others then fail their messages); an all-null column becomes a string; a decimal
    column DECIMAL(38, 18), as Spark infers one; a UUID its text.
    """
    names: dict[str, None] = {}
    for row in rows:
        for key in row:
            names.setdefault(key, None)
    fields = []
    for name in names:
        values = [row.get(name) for row in rows]
        try:
            t = _plain(pa.array(values), values).type
        except _CONVERT_ERRORS:
            t = pa.null()
            for v in values:
                if v is None:
                    continue
                try:
                    t = _plain(pa.array([v]), [v]).type
                    break
                except _CONVERT_ERRORS:
                    continue
        if pa.types.is_null(t):
            t = pa.string()
        elif pa.types.is_decimal(t) and t.scale <= 18 and t.precision - t.scale <= 20:
            # what Spark infers for a Python Decimal: a first batch of small prices must
            # not fix DECIMAL(3,2) for every later one
            t = pa.decimal128(38, 18)
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
    known = frozenset(schema.names)
    for i, row in enumerate(rows):
        if row.keys() <= known:      # the usual case, tested at C speed
            continue
        extra = [k for k in row if k not in known]
        bad[i] = (f"field {extra[0]!r} is not in the schema "
                  f"({', '.join(schema.names) or 'no columns'})")
    while True:
        keep = [i for i in range(len(rows)) if i not in bad]
        source = [rows[i] for i in keep] if bad else rows
        columns: dict[str, pa.Array] = {}
        new_bad = False
        for field in schema:
            name = field.name
            values = [row.get(name) for row in source]
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


def to_table(schema: pa.Schema, ids: Sequence[str], rows: list[Mapping[str, Any]]
             ) -> tuple[pa.Table | None, dict[int, str]]:
    """The rows that fit ``schema`` plus their ``message_id`` as one table (None when no
    row fits), and ``{row index: reason}`` for the rows that do not."""
    columns, bad = rows_to_table(schema, rows)
    keep = [mid for i, mid in enumerate(ids) if i not in bad] if bad else list(ids)
    if not keep:
        return None, bad
    columns["message_id"] = pa.array(keep, pa.string())
    fields = [*schema, ID_FIELD]
    return pa.Table.from_arrays(list(columns.values()), schema=pa.schema(fields)), bad


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` in ``schema``'s column order and types, or ``ValueError`` with the reason.

    The committer's check: batch processors that inferred their schema on their own may
    disagree (a column missing in one batch, ints here and floats there); a missing
    nullable column becomes nulls, a type changes only along :func:`_castable`.
    """
    if table.schema.equals(schema):
        return table
    extra = [n for n in table.column_names if schema.get_field_index(n) < 0]
    if extra:
        raise ValueError(f"column {extra[0]!r} is not in the dataset's schema "
                         f"({', '.join(schema.names)})")
    arrays = []
    for field in schema:
        if field.name not in table.column_names:
            if not field.nullable:
                raise ValueError(f"column {field.name!r} is NOT NULL but missing")
            arrays.append(pa.nulls(len(table), field.type))
            continue
        col = table.column(field.name)
        if col.type != field.type:
            if not _castable(col.type, field.type):
                raise ValueError(f"column {field.name!r} is {col.type}, the dataset's is "
                                 f"{field.type}")
            try:
                col = col.cast(field.type)
            except _CONVERT_ERRORS as exc:
                raise ValueError(f"column {field.name!r} does not cast to {field.type}: "
                                 f"{exc}") from None
        arrays.append(col)
    return pa.Table.from_arrays(arrays, schema=schema)


def to_ipc(table: pa.Table) -> bytes:
    """Arrow IPC stream bytes: what crosses from a batch processor to its committer."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def schema_to_ipc(schema: pa.Schema) -> bytes:
    return schema.serialize().to_pybytes()


def schema_from_ipc(data: bytes) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(data))
