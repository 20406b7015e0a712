"""The schema a dataset would have, found without a JVM: a DDL parsed, an existing dataset's
read from its files, and the Spark form of an Arrow schema for people to read.

Why: :mod:`offbroadway.testing` and ``offbroadway test`` convert rows against the schema the
daemon's committer would hand its batch processors (:meth:`.spark_sink.SparkSink.data_schema`
for a DDL, :meth:`.spark_sink.SparkSink.existing_schema` for a dataset that exists, else
the first batch's inferred types), and they must do it in a unit test, where starting Spark
(30 s of JVM) is not an option.

* A DDL is parsed here by a small parser of Spark's DDL grammar for column lists (the
  types Spark's ``createDataFrame(schema=…)`` accepts, ``NOT NULL``, ``COMMENT``,
  backquoted names) into pyspark's own :class:`~pyspark.sql.types.StructType`, then checked
  and turned into Arrow by :func:`ddl_fields_to_arrow`, the function the sink itself uses
  after Spark parsed the same string: the same checks, the same reasons, the same
  ``to_arrow_schema``.  A DDL this parser does not know is reported as such (Spark may still
  accept it: ``offbroadway check`` is the authority, with the JVM).
* An existing dataset's schema is read from its files' footers with pyarrow (Parquet and
  ORC; the layout ``<output>/<batcher>``, or a ``[spark] table``'s directory in the
  warehouse), then passed through Spark's types (``from_arrow_schema`` then
  ``to_arrow_schema``) as the sink's read through Spark is.

pyarrow and ``pyspark.sql.types`` only: no Connect client, no JVM.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from .spark_rows import RESERVED

__all__ = ["DDLError", "SchemaProblem", "dataset_schema", "ddl_fields_to_arrow",
           "ddl_schema", "parse_ddl", "spark_struct", "table_location"]


class DDLError(ValueError):
    """A DDL string this parser cannot read (the reason, one line)."""


class SchemaProblem(ValueError):
    """A parsed DDL that no row can be written against: ``reason`` is the line every
    message then fails with, as the daemon says it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# -- checks shared with the sink ---------------------------------------------------------------

def ddl_fields_to_arrow(parsed: DataType, partition_by: Sequence[str] = ()) -> pa.Schema:
    """A DDL's parsed Spark schema → the data columns as Arrow, or :class:`SchemaProblem`
    with the reason every message fails with.  The sink calls this on what Spark parsed;
    :func:`ddl_schema` on what :func:`parse_ddl` parsed."""
    from pyspark.errors import PySparkException
    from pyspark.sql.pandas.types import to_arrow_schema

    if not isinstance(parsed, StructType) or not parsed.fields:
        raise SchemaProblem("spark: the schema DDL does not describe columns")
    names = [f.name for f in parsed.fields]
    hit = [n for n in names if n in RESERVED]
    if hit:
        raise SchemaProblem(f"spark: the schema declares the reserved column {hit[0]!r}")
    missing = [c for c in partition_by if c not in names]
    if missing:
        raise SchemaProblem(f"spark: partition_by column {missing[0]!r} is not in the schema")
    try:
        return to_arrow_schema(parsed, timezone="UTC")
    except (PySparkException, TypeError, ValueError) as exc:
        raise SchemaProblem(f"spark: the schema has a type Arrow cannot carry: "
                            f"{_one_line(exc)}") from None


def ddl_schema(ddl: str, partition_by: Sequence[str] = ()) -> pa.Schema:
    """The DDL's data columns as the committer would fix them, or :class:`SchemaProblem`."""
    try:
        parsed = parse_ddl(ddl)
    except DDLError as exc:
        raise SchemaProblem(f"spark: the schema is not valid DDL: {exc}") from None
    return ddl_fields_to_arrow(parsed, partition_by)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


# -- the DDL parser -----------------------------------------------------------------------------

_SIMPLE: dict[str, DataType] = {
    "boolean": BooleanType(), "tinyint": ByteType(), "byte": ByteType(),
    "smallint": ShortType(), "short": ShortType(), "int": IntegerType(),
    "integer": IntegerType(), "bigint": LongType(), "long": LongType(),
    "float": FloatType(), "real": FloatType(), "double": DoubleType(),
    "string": StringType(), "binary": BinaryType(), "date": DateType(),
    "timestamp": TimestampType(), "timestamp_ltz": TimestampType(),
    "timestamp_ntz": TimestampNTZType(),
}
_TOKEN = re.compile(r"\s*(?:(`(?:[^`]|``)*`)|([A-Za-z_][A-Za-z0-9_]*)|(\d+)|('(?:[^'\\]|\\.)*')"
                    r"|(\"(?:[^\"\\]|\\.)*\")|([<>(),:]))")


class _Tokens:
    def __init__(self, text: str) -> None:
        self.items: list[tuple[str, str]] = []   # (kind, text)
        pos = 0
        text = text.rstrip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                raise DDLError(f"unexpected {text[pos:].strip()[:20]!r}")
            kinds = ("quoted", "word", "number", "string", "string", "punct")
            kind = next(k for k, g in zip(kinds, m.groups()) if g is not None)
            self.items.append((kind, m.group(m.lastindex or 0)))
            pos = m.end()
        self.at = 0

    def peek(self) -> tuple[str, str] | None:
        return self.items[self.at] if self.at < len(self.items) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise DDLError("unexpected end of the schema")
        self.at += 1
        return tok

    def expect(self, punct: str) -> None:
        kind, text = self.take()
        if kind != "punct" or text != punct:
            raise DDLError(f"expected {punct!r}, got {text!r}")

    def word_is(self, *words: str) -> bool:
        tok = self.peek()
        return tok is not None and tok[0] == "word" and tok[1].lower() in words

    def punct_is(self, punct: str) -> bool:
        return self.peek() == ("punct", punct)


def parse_ddl(ddl: str) -> StructType:
    """``"a BIGINT NOT NULL, b ARRAY<STRING>, c STRUCT<x: INT>"`` → a StructType, or
    :class:`DDLError`.  Also the ``struct<…>`` form and ``name: type`` pairs."""
    toks = _Tokens(ddl)
    if toks.word_is("struct") and len(toks.items) > 1 and toks.items[1] == ("punct", "<"):
        parsed = _type(toks)
    else:
        parsed = StructType(_fields(toks, end=None))
    if toks.peek() is not None:
        raise DDLError(f"unexpected {toks.peek()[1]!r}")   # type: ignore[index]
    return parsed   # type: ignore[return-value]


def _name(toks: _Tokens) -> str:
    kind, text = toks.take()
    if kind == "quoted":
        return text[1:-1].replace("``", "`")
    if kind != "word":
        raise DDLError(f"expected a column name, got {text!r}")
    return text


def _fields(toks: _Tokens, end: str | None) -> list[StructField]:
    fields: list[StructField] = []
    while True:
        name = _name(toks)
        if toks.punct_is(":"):
            toks.take()
        dtype = _type(toks)
        nullable = True
        while toks.word_is("not", "comment"):
            if toks.word_is("not"):
                toks.take()
                if not toks.word_is("null"):
                    raise DDLError("expected NULL after NOT")
                toks.take()
                nullable = False
            else:
                toks.take()
                kind, _ = toks.take()
                if kind != "string":
                    raise DDLError("expected a quoted comment after COMMENT")
        if name.lower() in (f.name.lower() for f in fields):
            raise DDLError(f"the column {name!r} is declared twice")
        fields.append(StructField(name, dtype, nullable))
        if toks.punct_is(","):
            toks.take()
            continue
        if end is None and toks.peek() is None:
            return fields
        if end is not None and toks.punct_is(end):
            return fields
        tok = toks.peek()
        raise DDLError(f"unexpected {tok[1]!r}" if tok else "unexpected end of the schema")


def _type(toks: _Tokens) -> DataType:
    kind, word = toks.take()
    if kind != "word":
        raise DDLError(f"expected a type, got {word!r}")
    low = word.lower()
    if low in _SIMPLE:
        return _SIMPLE[low]
    if low in ("decimal", "dec", "numeric"):
        precision, scale = 10, 0
        if toks.punct_is("("):
            toks.take()
            precision = _number(toks)
            if toks.punct_is(","):
                toks.take()
                scale = _number(toks)
            toks.expect(")")
        if not 1 <= precision <= 38 or not 0 <= scale <= precision:
            raise DDLError(f"decimal({precision},{scale}) is not a valid decimal type")
        return DecimalType(precision, scale)
    if low in ("char", "varchar", "character"):
        # Spark parses them, then fails the DataFrame the schema is for (INTERNAL_ERROR:
        # "should not have output of char/varchar type"): no row could be written
        raise DDLError(f"{word.upper()} columns cannot be written by a DataFrame: use STRING")
    if low == "array":
        toks.expect("<")
        element = _type(toks)
        toks.expect(">")
        return ArrayType(element, True)
    if low == "map":
        toks.expect("<")
        key = _type(toks)
        toks.expect(",")
        value = _type(toks)
        toks.expect(">")
        return MapType(key, value, True)
    if low == "struct":
        toks.expect("<")
        if toks.punct_is(">"):
            toks.take()
            return StructType([])
        fields = _fields(toks, end=">")
        toks.expect(">")
        return StructType(fields)
    raise DDLError(f"unknown type {word!r} (known here: {', '.join(sorted(_SIMPLE))}, "
                   f"decimal(p,s), array<>, map<>, struct<>)")


def _number(toks: _Tokens) -> int:
    kind, text = toks.take()
    if kind != "number":
        raise DDLError(f"expected a number, got {text!r}")
    return int(text)


# -- an existing dataset's schema ----------------------------------------------------------------

def table_location(table: str, warehouse: str) -> str:
    """Where Spark's Hive catalog keeps a managed table's files: ``<warehouse>/<name>`` in
    the default database, ``<warehouse>/<db>.db/<name>`` in another (names lower-cased,
    as the metastore stores them)."""
    db, _, name = table.rpartition(".")
    if db and db.lower() != "default":
        return os.path.join(warehouse, f"{db.lower()}.db", name.lower())
    return os.path.join(warehouse, name.lower())


def dataset_schema(path: str, format: str = "parquet", merge: bool = False
                   ) -> pa.Schema | None:
    """The data columns of the dataset at ``path`` as the sink's read through Spark gives
    them (``message_id``, ``ingested_at`` left out), or None when there is no dataset
    there yet; ``merge``: every file's columns (``mergeSchema``), else the first's.
    Parquet and ORC are read from their footers; another format (JSON, whose types Spark
    infers from the values) raises :class:`ValueError`: that schema needs Spark itself."""
    if format not in ("parquet", "orc"):
        raise ValueError(f"the schema of a {format} dataset is inferred by Spark from its "
                         f"values: it cannot be read without Spark")
    if not os.path.isdir(path):
        return None
    import pyarrow.dataset as ds
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs
                   if not f.startswith(("_", ".")) and f.endswith(f".{format}"))
    if not files:
        return None
    dataset = ds.dataset(files, format=format, partitioning="hive", partition_base_dir=path)
    found = dataset.schema
    if merge:     # ``schema = "evolve"``: the sink reads it with mergeSchema
        try:
            found = pa.unify_schemas([found, *(f.physical_schema
                                               for f in dataset.get_fragments())])
        except (pa.ArrowException, ValueError):
            pass    # types that disagree: Spark's merged read refuses it as well
    data = pa.schema([f for f in found if f.name not in RESERVED])
    if not len(data):
        return None
    return to_arrow_schema(from_arrow_schema(data), timezone="UTC")


def spark_struct(schema: pa.Schema, with_reserved: bool = True) -> StructType:
    """The Spark schema of a dataset whose data columns are ``schema``, as ``spark.read``
    (or ``spark.table``) shows it: plus ``message_id`` and ``ingested_at``, every column
    nullable (Spark reads the files' columns so, whatever they were written as)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    fields = list(from_arrow_schema(schema).fields)
    if with_reserved:
        fields += [StructField("message_id", StringType()),
                   StructField("ingested_at", TimestampType())]
    return StructType([StructField(f.name, f.dataType, True) for f in fields])
