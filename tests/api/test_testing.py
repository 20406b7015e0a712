"""The in-process test helpers users unit-test their pipelines with (Broadway's
``test_message`` / ``test_batch``): the same callback semantics as the stages."""

from __future__ import annotations

import pytest
from offbroadway import Message, Pipeline
from offbroadway.testing import test_batch, test_message, test_messages

from examples.orders import Orders


class Doubler(Pipeline):
    def handle_message(self, processor, message, context):
        if message.data == "raise":
            raise ValueError("no strings attached")
        if message.data < 0:
            return message.failed("negative")
        return message.update_data(lambda d: d * 2).put_batcher("even" if message.data % 4 == 0
                                                                 else "odd")

    def handle_batch(self, batcher, messages, batch_info, context):
        context.setdefault("batches", []).append((batcher, batch_info.size))
        return [m for m in messages if m.data != 6]   # leaves one out: it must fail

    def handle_failed(self, messages, context):
        context.setdefault("failed_seen", []).extend(m.data for m in messages)
        return messages


def test_test_message_runs_handle_message_only() -> None:
    result = test_message(Doubler(), 3)
    assert [m.data for m in result.successful] == [6]
    assert result.failed == [] and result.batches == []


def test_failures_and_exceptions_reach_handle_failed() -> None:
    context: dict = {}
    result = test_messages(Doubler(), [1, -1, "raise"], context=context)
    assert [m.data for m in result.successful] == [2]
    reasons = sorted(m.status for m in result.failed)
    assert reasons[0] == "handle_message raised ValueError: no strings attached"
    assert reasons[1] == "negative"
    assert sorted(map(str, context["failed_seen"])) == ["-1", "raise"]


def test_batches_group_by_batcher_and_size_and_missing_messages_fail() -> None:
    context: dict = {}
    result = test_messages(Doubler(), [1, 2, 3, 4, 5], context=context,
                           batchers={"even": 2, "odd": 2})
    # data doubled: 2, 4, 6, 8, 10 → even batcher gets 4 and 8, odd gets 2, 6, 10
    assert sorted(context["batches"]) == [("even", 2), ("odd", 1), ("odd", 2)]
    assert sorted(m.data for m in result.successful) == [2, 4, 8, 10]
    assert [(m.data, m.status) for m in result.failed] == [(6, "not returned by handle_batch")]


def test_test_batch_with_the_example_pipeline() -> None:
    result = test_batch(Orders(), [{"sku": "fig", "qty": 2, "unit_price": 1.5}, {"qty": 1}],
                        batcher="spark", context={"batcher": "spark"})
    assert [m.data["total"] for m in result.successful] == [3.0]
    assert [m.status for m in result.failed] == ["not an order: needs sku and qty"]
    assert isinstance(result.successful[0], Message)


class Filter(Pipeline):
    """Discards odd numbers (acked, written nowhere), routes the rest to ``spark``."""

    def handle_message(self, processor, message, context):
        if message.data % 2:
            return message.discard()
        return message.put_batcher("spark")


def test_discarded_messages_are_acked_and_reach_no_batch() -> None:
    result = test_messages(Filter(), [1, 2, 3, 4], batchers={"spark": 10})
    assert [m.data for m in result.discarded] == [1, 3]
    assert all(m.is_discarded for m in result.discarded)
    assert [m.data for _, batch in result.batches for m in batch] == [2, 4]
    assert [m.data for m in result.successful] == [2, 4] and result.failed == []


# -- what runs between the callbacks: the wire codec and the conversion to Arrow ----------------

def _lines() -> list[dict]:
    """One line of each kind :class:`tests.api.parity_handlers.Parity` turns into a row:
    fine, a set, an object, a tuple (fine: a list on the wire), a str and a float where
    the dataset's ``n`` is an integer."""
    kinds = [("ok", 1), ("set", 2), ("object", 3), ("tuple", 4), ("ok", "x"), ("ok", 2.5),
             ("ok", 7)]
    return [{"seq": i, "kind": k, "n": n} for i, (k, n) in enumerate(kinds)]


def _reasons(result) -> dict[int, str]:
    return {m.data["seq"]: m.status for m in result.failed}


CARRIED = "(JSON's types, bytes, tuples, datetime, date, time, Decimal and UUID cross stages)"


def test_values_the_codec_cannot_carry_fail_as_the_processor_fails_them() -> None:
    from tests.api.parity_handlers import Parity

    result = test_batch(Parity(), _lines(), batcher="spark")
    assert _reasons(result) == {
        1: f"data['tags'] is a set {CARRIED}: it cannot be sent on to the batcher",
        2: f"data['tags'] is a tests.api.parity_handlers.Thing {CARRIED}: it cannot be "
           f"sent on to the batcher"}
    # what handle_batch saw crossed the wire: the tuple is a list there
    tags = {m.data["seq"]: m.data["tags"] for m in result.successful}
    assert tags[3] == ["a", "b"] and type(tags[3]) is list


def test_a_source_value_the_codec_cannot_carry_fails_before_the_handler() -> None:
    seen: list = []

    class Spy(Pipeline):
        def handle_message(self, processor, message, context):
            seen.append(message.data)
            return message

    result = test_messages(Spy(), [{"a": 1}, {"a": {1, 2}}])
    assert seen == [{"a": 1}]
    assert [m.status for m in result.failed] == [
        f"data['a'] is a set {CARRIED}: it cannot be sent to the processors"]


def test_rows_that_do_not_fit_a_ddl_fail_with_the_batch_processors_reason() -> None:
    from tests.api.parity_handlers import Parity

    result = test_batch(Parity(), _lines(), batcher="spark",
                        spark="seq BIGINT, n BIGINT, tags ARRAY<STRING>")
    reasons = _reasons(result)
    assert reasons[4] == "spark: field 'n' does not fit the schema: expected int64, got string"
    assert reasons[5].startswith("spark: field 'n' does not fit the schema: ")
    assert sorted(reasons) == [1, 2, 4, 5]
    assert sorted(m.data["seq"] for m in result.successful) == [0, 3, 6]
    table = result.tables["spark"]
    assert table.column_names == ["seq", "n", "tags", "message_id"]
    assert table.column("seq").to_pylist() == [0, 3, 6]
    assert result.schema_sources == {"spark": "ddl"}


def test_a_bad_ddl_fails_every_row_with_one_reason() -> None:
    from tests.api.parity_handlers import Parity

    result = test_batch(Parity(), _lines()[:1], batcher="spark",
                        spark="seq BIGINT, message_id STRING")
    assert [m.status for m in result.failed] == [
        "spark: the schema declares the reserved column 'message_id'"]
    result = test_batch(Parity(), _lines()[:1], batcher="spark", spark="seq BIGGINT")
    assert result.failed[0].status.startswith("spark: the schema is not valid DDL: ")


def test_rows_that_do_not_fit_an_existing_dataset_fail(tmp_path) -> None:
    """The dataset's schema is read from its files (here written by pyarrow as Spark
    would: ``n`` a BIGINT): ``n = "x"`` and ``n = 2.5`` fail, the rest pass."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from offbroadway.daemon.config.load import validate

    from tests.api.parity_handlers import Parity

    out = tmp_path / "out"
    (out / "spark").mkdir(parents=True)
    pq.write_table(pa.table({"seq": pa.array([100], pa.int64()), "n": pa.array([1], pa.int64()),
                             "tags": pa.array([["x"]], pa.list_(pa.string())),
                             "message_id": ["m"],
                             "ingested_at": pa.array([0], pa.timestamp("us", "UTC"))}),
                   out / "spark" / "part-00000.snappy.parquet")
    config = validate({"pipeline": {"name": "p", "handler": "tests.api.parity_handlers:Parity"},
                       "producer": {"source": "spool", "options": {"path": str(tmp_path)}},
                       "batchers": {"spark": {"batch_size": 3}},
                       "spark": {"output": str(out)},
                       "runtime": {"dir": str(tmp_path / "r"),
                                   "state_dir": str(tmp_path / "s")}}).config
    result = test_messages(Parity(), _lines(), config=config)
    assert result.schema_sources == {"spark": "dataset"}
    assert sorted(_reasons(result)) == [1, 2, 4, 5]
    assert sorted(m.data["seq"] for m in result.successful) == [0, 3, 6]
    # batches of 3 as the batcher cuts them: 5 messages reached it
    assert [info.size for info, _ in result.batches] == [3, 2]


def test_the_first_batch_fixes_an_inferred_schema() -> None:
    from tests.api.parity_handlers import Parity

    lines = [{"seq": 0, "n": 1}, {"seq": 1, "n": "x"}]
    result = test_messages(Parity(), lines, batchers={"spark": 1}, spark=True)
    assert _reasons(result) == {
        1: "spark: field 'n' does not fit the schema: expected int64, got string"}
    assert str(result.schemas["spark"].field("n").type) == "int64"


def test_ddl_the_parser_refuses_in_one_line() -> None:
    from offbroadway.stages.spark import spark_schema

    for ddl, says in [("a VARCHAR(3)", "VARCHAR columns cannot be written by a DataFrame"),
                      ("a INT,", "unexpected end of the schema"),
                      ("a INTERVAL", "unknown type 'INTERVAL'"),
                      ("a INT, A STRING", "declared twice"),
                      ("a DECIMAL(40, 2)", "not a valid decimal type")]:
        with pytest.raises(spark_schema.SchemaProblem) as exc:
            spark_schema.ddl_schema(ddl)
        assert says in exc.value.reason and "\n" not in exc.value.reason


def test_evolve_adds_a_new_field_as_a_column_and_refuses_a_changed_type() -> None:
    """``[spark] schema = "evolve"``: the second batch's new field ``c`` is a new nullable
    column (the first batch's row has it null); a field whose type changes still fails,
    with a line naming it and both types."""
    import pyarrow as pa

    class Grows(Pipeline):
        def handle_message(self, processor, message, context):
            return message.put_batcher("spark")

    lines = [{"a": 1, "b": "x"}, {"a": 2, "b": "y", "c": 1.5}, {"a": "three", "b": "z"}]
    result = test_messages(Grows(), lines, batchers={"spark": 1}, spark="evolve")
    assert result.schemas["spark"] == pa.schema([("a", pa.int64()), ("b", pa.string()),
                                                 ("c", pa.float64())])
    assert [m.status for m in result.failed] == [
        "spark: field 'a' does not fit the schema: expected int64, got string"]
    fixed = test_messages(Grows(), lines, batchers={"spark": 1}, spark=True)
    assert [m.status for m in fixed.failed][0].startswith(
        "spark: field 'c' is not in the schema (a, b)")
    from offbroadway.stages.spark.spark_evolve import widen_to

    with pytest.raises(ValueError, match="field 'a' changed type: the dataset has int64, "
                                         "this batch string"):
        widen_to(pa.schema([("a", pa.int64())]), pa.schema([("a", pa.string())]))


def test_evolve_against_an_existing_dataset_from_the_config(tmp_path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from offbroadway.daemon.config.load import validate

    class Grows(Pipeline):
        def handle_message(self, processor, message, context):
            return message.put_batcher("spark")

    out = tmp_path / "out"
    (out / "spark").mkdir(parents=True)
    pq.write_table(pa.table({"a": pa.array([1], pa.int64()), "message_id": ["m"]}),
                   out / "spark" / "part-0.parquet")
    raw = {"pipeline": {"name": "p", "handler": "x.y:Z"},
           "producer": {"source": "spool", "options": {"path": str(tmp_path)}},
           "batchers": {"spark": {"batch_size": 10}},
           "spark": {"output": str(out), "schema": "evolve"},
           "runtime": {"dir": str(tmp_path / "r"), "state_dir": str(tmp_path / "s")}}
    result = test_messages(Grows(), [{"a": 2, "c": "new"}], config=validate(raw).config)
    assert result.failed == [] and result.schema_sources == {"spark": "dataset"}
    assert result.schemas["spark"].names == ["a", "c"]
    raw["spark"]["schema"] = "fixed"
    result = test_messages(Grows(), [{"a": 2, "c": "new"}], config=validate(raw).config)
    assert [m.status for m in result.failed] == [
        "spark: field 'c' is not in the schema (a)"]
