"""Unit-testing a pipeline in-process, as Broadway's ``test_message`` / ``test_batch``: no
processes, no sockets, no JVM, and what runs between the callbacks is what the daemon runs.

    from offbroadway.testing import test_batch

    result = test_batch(Orders(), [{"sku": "fig", "qty": 2, "unit_price": 1.5}],
                        batcher="spark", spark=True)
    assert [m.data["total"] for m in result.successful] == [3.0]

The callbacks are called by the very functions the stages call
(:mod:`offbroadway.stages.runtime.callbacks`).  Between them, every value that crosses
from one stage to the next is encoded into the same frames by the same codec and decoded
again (:mod:`offbroadway.stages.wire.protocol`): a message whose data the codec cannot
carry (a ``set``, an object of your own) fails with the daemon's reason, and the handler
sees what the daemon's would (a tuple arrives as a list, a datetime's zone as its fixed
offset).  Batches are cut by the batcher's own accumulator.  With Spark (``spark=``, or a
config with a ``[spark]`` section) the rows ``handle_batch`` returns are converted to Arrow
against the schema the dataset would have, by the function the batch processor uses
(:func:`offbroadway.stages.spark.spark_rows.convert`): a DDL (parsed without a JVM by
:mod:`offbroadway.stages.spark.spark_schema`), else the existing dataset's schema (read from
its files), else the first batch's inferred types, so a row that does not fit fails here
with the reason the daemon gives.  As one batch processor per batcher would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from .message import BatchInfo, Message
from .pipeline import Pipeline

if TYPE_CHECKING:   # pyarrow is only needed (and imported) with Spark
    import pyarrow as pa

__all__ = ["Result", "SparkTarget", "test_batch", "test_message", "test_messages"]


@dataclass
class Result:
    """What the source would be told: acked and failed messages, plus the batches made.

    ``discarded`` are acked too, without reaching a batcher (:meth:`Message.discard`, with
    batchers); without batchers a discarded message is simply in ``successful``.  With
    Spark, ``successful`` are the messages whose row would be written; ``tables`` holds
    those rows per batcher (the data columns and ``message_id``, as handed to Spark) and
    ``schemas`` each dataset's data columns, ``schema_sources`` where they came from
    (``"ddl"``, ``"dataset"`` or ``"inferred"``)."""

    successful: list[Message] = field(default_factory=list)
    failed: list[Message] = field(default_factory=list)
    discarded: list[Message] = field(default_factory=list)
    batches: list[tuple[BatchInfo, list[Message]]] = field(default_factory=list)
    tables: dict[str, pa.Table] = field(default_factory=dict)
    schemas: dict[str, pa.Schema] = field(default_factory=dict)
    schema_sources: dict[str, str] = field(default_factory=dict)


@dataclass
class SparkTarget:
    """The schema one batcher's rows are converted against, as its committer would fix it:
    ``schema`` (data columns; None: inferred from the first batch), or ``error``, the
    reason every message fails with (a DDL that cannot be used)."""

    schema: pa.Schema | None = None
    source: str = "inferred"
    error: str | None = None
    partition_by: tuple[str, ...] = ()
    #: ``[spark] schema = "evolve"``: a new field becomes a new nullable column
    evolve: bool = False

    @classmethod
    def of(cls, spec: Any, partition_by: Iterable[str] = ()) -> SparkTarget:
        """``True`` or ``"fixed"`` (infer), ``"evolve"``, a DDL string, an Arrow schema,
        or a target already."""
        if isinstance(spec, SparkTarget):
            return spec
        parts = tuple(partition_by)
        if spec is True or spec == "fixed":
            return cls(partition_by=parts)
        if spec == "evolve":
            return cls(partition_by=parts, evolve=True)
        if isinstance(spec, str):
            from offbroadway.stages.spark import spark_schema

            try:
                return cls(spark_schema.ddl_schema(spec, parts), "ddl", partition_by=parts)
            except spark_schema.SchemaProblem as exc:
                return cls(None, "ddl", exc.reason, parts)
        import pyarrow as pa

        if isinstance(spec, pa.Schema):
            return cls(spec, "given", partition_by=parts)
        raise TypeError(f"spark= takes True, a DDL string or a pyarrow schema, not "
                        f"{type(spec).__name__}")


def targets_from_config(config: Any) -> dict[str, SparkTarget]:
    """Each batcher's :class:`SparkTarget` under a config's ``[spark]`` section (``config``:
    a :class:`offbroadway.daemon.config.load.Config`): the DDL, else the existing dataset's
    schema read from its files (the dataset path, or a ``table``'s directory in the
    daemon's warehouse), else inferred.  Empty without ``[spark]``."""
    spark = config.spark
    if spark is None:
        return {}
    import os

    from offbroadway.stages.spark import spark_schema

    out: dict[str, SparkTarget] = {}
    for key in config.batchers:
        if spark.schema:
            out[key] = SparkTarget.of(spark.schema, spark.partition_by)
            continue
        if spark.table:
            warehouse = os.path.join(config.runtime.state_dir, "spark-warehouse")
            path = spark_schema.table_location(spark.table.replace("{batcher}", key),
                                               warehouse)
        else:
            path = os.path.join(spark.output, key)
        try:
            found = spark_schema.dataset_schema(path, spark.format, merge=spark.evolve)
        except ValueError:
            found = None     # a JSON dataset's schema needs Spark: inferred, as a new one
        out[key] = SparkTarget(found, "dataset" if found is not None else "inferred",
                               partition_by=tuple(spark.partition_by), evolve=spark.evolve)
    return out


# -- the wire, as the stages use it ----------------------------------------------------------

def _from_source(items: list[tuple]) -> list[Message]:
    """Messages as a processor receives them from a producer: their values encoded as the
    producer encodes them (:func:`~offbroadway.stages.wire.events.encode_items`), through an
    EVENTS frame.  A value the codec cannot carry fails its message as the producer fails it
    (its value then travels as its ``repr``); an item with a fourth field arrives failed with
    that reason (a spool line that is not JSON)."""
    from offbroadway.stages.wire import events as ev
    from offbroadway.stages.wire import protocol

    codec, ids, datas, metas, bad = ev.encode_items([(i[0], i[1], i[2], None)
                                                      for i in items])
    bad = {k: f"{why}: it cannot be sent to the processors" for k, why in bad.items()}
    ids = [i if protocol.packable(i) else repr(i) for i in ids]
    for k, msg_id in enumerate(ids):
        if msg_id is not items[k][0] and k not in bad:
            why = protocol.unpackable(items[k][0], "the id") or "the id"
            bad[k] = f"{why}: it cannot be sent to the processors"
        elif k not in bad and len(items[k]) > 3 and items[k][3] is not None:
            bad[k] = items[k][3]
    rows = ev.new_rows(0, 0, ids, datas, metas)
    out: list[Message] = []
    healthy = [row for k, row in enumerate(rows) if k not in bad]
    decoded = iter(_through_frame(healthy, None, codec) if healthy else [])
    for k, row in enumerate(rows):
        if k in bad:
            [m] = _through_frame([row], bad[k], codec)
            out.append(m)
        else:
            out.append(next(decoded))
    return out


def _through_frame(rows: list[tuple], status: str | None, codec: int) -> list[Message]:
    from offbroadway.stages.wire import protocol

    frame = protocol.decode(protocol.events(rows, status, codec=codec))
    return protocol.to_messages(protocol.open_events(frame[protocol.EVENTS_PACKED]),
                                frame[protocol.EVENTS_STATUS])


def _to_batcher(done: list[Message]) -> tuple[list[tuple[Any, list[tuple]]], list[Message]]:
    """A processor's output to its batchers: per batch key, the event rows as the batcher
    receives them (their data still encoded), and the messages that fail because the
    codec cannot carry them, with the processor's reason."""
    from offbroadway.stages.roles.processor import ONWARD
    from offbroadway.stages.wire import events as ev
    from offbroadway.stages.wire import protocol
    from offbroadway.stages.wire.values import split_unsendable

    kept, bad = split_unsendable(done, ONWARD)
    runs: list[tuple[Any, list[tuple]]] = []
    start = 0
    for i in range(1, len(kept) + 1):      # one frame per run of one batch key
        if i == len(kept) or kept[i].batch_key != kept[start].batch_key:
            run = kept[start:i]
            frame = protocol.decode(protocol.message_events(run, run[0].batch_key))
            block = protocol.open_events(frame[protocol.EVENTS_PACKED])
            runs.append((frame[protocol.EVENTS_BATCH_KEY],
                         ev.transcode(block.rows(), block.codec)))
            start = i
    return runs, bad


def _batches(batcher: str, runs: list[tuple[Any, list[tuple]]], size: int,
             in_bytes: bool) -> list[tuple[BatchInfo, list[Message]]]:
    """The batcher's cut (its own accumulator; everything arrives at once and the rest is
    flushed), each batch through a BATCH frame to the batch processor."""
    from offbroadway.stages.flow.batching import BatchAccumulator
    from offbroadway.stages.wire import protocol
    from offbroadway.stages.wire.events import row_bytes

    acc: BatchAccumulator = BatchAccumulator(size, 1.0, row_bytes if in_bytes else None)
    cut = []
    for key, raw in runs:
        cut.extend(acc.add_run(key, raw, 0.0))
    cut.extend(acc.flush())
    out = []
    for batch in cut:
        frame = protocol.decode(protocol.batch(batch.key, batch.trigger, batch.items))
        events = protocol.open_events(frame[protocol.BATCH_PACKED])
        messages = protocol.to_messages(events, None, batcher, frame[protocol.BATCH_KEY])
        out.append((BatchInfo(batcher, frame[protocol.BATCH_KEY], len(messages),
                              frame[protocol.BATCH_TRIGGER]), messages))
    return out


# -- the run ---------------------------------------------------------------------------------

def run(pipeline: Pipeline, items: list[tuple], *, context: Any = None,
        batchers: dict[str, int] | None = None, batch_bytes: Iterable[str] = (),
        spark: dict[str, SparkTarget] | None = None) -> Result:
    """``(id, data, metadata)`` items through the pipeline as the daemon runs them (the
    module doc); a fourth field, when not None, is why the source already failed it.
    ``batchers``: key → batch_size (bytes for the keys in ``batch_bytes``); ``spark``: the
    batchers that write to Spark, with their targets."""
    from offbroadway.stages.runtime import callbacks

    context = {} if context is None else context
    spark = dict(spark or {})
    messages = _from_source(items)
    done, failed, discarded = callbacks.process(pipeline, messages, context,
                                                set(batchers or ()))
    result = Result(discarded=discarded)
    if not batchers:
        result.successful = done
        if failed:
            result.failed = callbacks.handle_failed(pipeline, failed, context)
        return result
    by_batcher: dict[str, list[Message]] = {}
    for m in done:
        by_batcher.setdefault(m.batcher, []).append(m)
    runs: dict[str, list[tuple[Any, list[bytes]]]] = {}
    for key, msgs in by_batcher.items():
        runs[key], bad = _to_batcher(msgs)
        failed.extend(bad)
    if failed:   # the processor shows its failures to handle_failed
        result.failed = callbacks.handle_failed(pipeline, failed, context)
    tables: dict[str, list] = {}
    in_bytes = set(batch_bytes)
    for key, key_runs in runs.items():
        target = spark.get(key)
        schema = target.schema if target is not None else None
        for info, batch in _batches(key, key_runs, batchers[key], key in in_bytes):
            rows = callbacks.handle_batch(pipeline, key, batch, info, context)
            result.batches.append((info, batch))
            if target is not None and rows:
                from offbroadway.stages.spark import spark_evolve, spark_rows

                if target.evolve and schema is not None:   # as the batch processor does
                    schema = spark_evolve.widen(schema, [m.data for m in rows
                                                         if m.status is None])

                converted = spark_rows.convert(rows, schema, target.partition_by,
                                               target.error)
                if schema is None:   # the first batch fixes the dataset's schema
                    schema = converted.schema
                if converted.table is not None:
                    tables.setdefault(key, []).append(converted.table)
            result.successful.extend(m for m in rows if m.status is None)
            batch_failed = [m for m in batch if m.status is not None]
            if batch_failed:   # the batch processor shows its failures to handle_failed
                result.failed.extend(callbacks.handle_failed(pipeline, batch_failed, context))
        if target is not None:
            if schema is not None:
                result.schemas[key] = schema
            result.schema_sources[key] = target.source
    if tables:   # in the dataset's final schema (evolve: earlier rows null in new columns)
        import pyarrow as pa
        from offbroadway.stages.spark import spark_rows

        result.tables = {k: pa.concat_tables([spark_rows.conform(
            t, result.schemas[k].append(spark_rows.ID_FIELD)) for t in v])
            for k, v in tables.items()}
    return result


def _items(data: Iterable[Any], metadata: dict | None) -> list[tuple[Any, Any, dict]]:
    return [(f"test-{i}", d, dict(metadata or {})) for i, d in enumerate(data)]


def test_messages(pipeline: Pipeline, data: Iterable[Any], *, context: Any = None,
                  metadata: dict | None = None, batchers: dict[str, int] | None = None,
                  spark: Any = None, config: Any = None) -> Result:
    """Run messages through ``handle_message`` and, if ``batchers`` (key → batch_size) are
    given, through ``handle_batch`` in batches of that size per batcher and batch key, as
    the batcher would cut them (the rest flushed), with the wire codec between the stages.
    Failed messages go through ``handle_failed``.

    ``spark``: the batchers write to Spark: ``True`` (the schema inferred from the first
    batch, as for a new dataset), ``"evolve"`` (new fields become new columns), a DDL
    string (``[spark] schema``), a pyarrow schema (an existing dataset's data columns),
    a :class:`SparkTarget`, or a dict batcher → one of those.  ``config``: a
    config file's path (or a loaded ``Config``): its batchers' sizes, its ``[pipeline]
    context`` and its ``[spark]`` section (its DDL, else the existing dataset's schema, else
    inferred) unless given here."""
    targets: dict[str, SparkTarget] = {}
    batch_bytes: set[str] = set()
    if config is not None:
        if isinstance(config, str):
            from offbroadway.daemon.config.load import load_config

            config = load_config(config).config
        if batchers is None:
            batchers = {k: b.batch_size for k, b in config.batchers.items()}
            batch_bytes = {k for k, b in config.batchers.items() if b.batch_bytes}
        if context is None:
            context = dict(config.pipeline.context)
        if spark is None:
            targets = targets_from_config(config)
    if spark is not None and spark is not False:
        keys = list(batchers or ())
        if isinstance(spark, dict):
            targets = {k: SparkTarget.of(v) for k, v in spark.items()}
        else:
            target = SparkTarget.of(spark)
            targets = {k: target for k in keys}
    return run(pipeline, _items(data, metadata), context=context, batchers=batchers,
               batch_bytes=batch_bytes, spark=targets)


def test_message(pipeline: Pipeline, data: Any, **kwargs: Any) -> Result:
    return test_messages(pipeline, [data], **kwargs)


def test_batch(pipeline: Pipeline, data: Iterable[Any], *, batcher: str = "default",
               batch_size: int | None = None, **kwargs: Any) -> Result:
    """All of ``data`` through ``handle_message`` into one batcher's ``handle_batch``."""
    items = list(data)
    return test_messages(pipeline, items, batchers={batcher: batch_size or max(1, len(items))},
                         **kwargs)


# pytest would otherwise collect these helpers as tests when a user imports them.
test_messages.__test__ = False  # type: ignore[attr-defined]
test_message.__test__ = False  # type: ignore[attr-defined]
test_batch.__test__ = False  # type: ignore[attr-defined]
