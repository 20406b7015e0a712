"""``[spark] schema = "evolve"``: a dataset's schema that grows, on purpose.

By default (``schema = "fixed"``) the first batch, a DDL or the dataset already there fixes
the columns, and a field a handler starts to return later fails every row that has it
("field 'c' is not in the schema").  With ``evolve`` a new field becomes a new nullable
column: the batch processor widens the schema it converts against (:func:`widen`, the
new field's type inferred from the rows as a first batch's would be), the committer widens
the dataset's schema with the new columns of a staged file (:func:`widen_to`), rewriting
the files of other batch processors in it (the missing column null), and the sink has
Spark add the column to a table's catalog entry (:func:`add_columns_sql`) before the
append; a Parquet dataset is then read whole with ``mergeSchema``.  A field whose type
changes is still refused, with one line naming the field and both types: only additions
are safe for every reader of the dataset.

Pure: pyarrow only (the SQL text is made with pyspark's types, imported where called).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from .spark_rows import RESERVED, infer_schema

__all__ = ["EVOLVE", "FIXED", "add_columns_sql", "new_fields", "widen", "widen_to"]

#: the values of ``[spark] schema`` that are not a DDL
FIXED, EVOLVE = "fixed", "evolve"


def widen(schema: pa.Schema | None, rows: Sequence[Any]) -> pa.Schema | None:
    """``schema`` with a nullable column appended for each field of ``rows`` (message data
    mappings) it does not have, typed as a first batch's would be (:func:`infer_schema`);
    ``schema`` itself when nothing is new (or None: the first batch infers it all)."""
    if schema is None:
        return None
    known = set(schema.names)
    new: dict[str, None] = {}
    for data in rows:
        if isinstance(data, Mapping) and not data.keys() <= known:
            for k in data:
                if k not in known and isinstance(k, str) and k not in RESERVED:
                    new.setdefault(k, None)
    if not new:
        return schema
    sample = [{k: data.get(k) for k in new} for data in rows if isinstance(data, Mapping)]
    added = infer_schema(sample)
    return pa.schema([*schema, *(f.with_nullable(True) for f in added)])


def widen_to(dataset: pa.Schema, table: pa.Schema) -> pa.Schema:
    """The dataset's schema with ``table``'s new columns appended (nullable), or
    ``ValueError`` naming a column whose type differs and both types."""
    out = list(dataset)
    for field in table:
        if field.name in RESERVED:
            continue
        at = dataset.get_field_index(field.name)
        if at < 0:
            out.append(field.with_nullable(True))
        elif not dataset.field(at).type.equals(field.type):
            from .spark_rows import _castable

            if not _castable(field.type, dataset.field(at).type):
                raise ValueError(f"field {field.name!r} changed type: the dataset has "
                                 f"{dataset.field(at).type}, this batch {field.type} (only "
                                 f"new fields are added to the schema)")
    return pa.schema(out)


def new_fields(before: pa.Schema | None, after: pa.Schema) -> list[pa.Field]:
    """The columns ``after`` has that ``before`` has not (all of them: no ``before``)."""
    if before is None:
        return []
    return [f for f in after if before.get_field_index(f.name) < 0]


def add_columns_sql(table: str, fields: Sequence[pa.Field]) -> str:
    """``ALTER TABLE t ADD COLUMNS (c bigint, …)``: a table's catalog entry widened."""
    from pyspark.sql.pandas.types import from_arrow_type

    def name(n: str) -> str:
        return "`" + n.replace("`", "``") + "`"

    cols = ", ".join(f"{name(f.name)} {from_arrow_type(f.type).simpleString()}"
                     for f in fields)
    return f"ALTER TABLE {table} ADD COLUMNS ({cols})"
