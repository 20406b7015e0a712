"""The staged file's mark of redelivered messages (spark_staging): pure, no Spark."""

from __future__ import annotations

import pyarrow as pa
from offbroadway import Message
from offbroadway.stages.spark.spark_staging import (
    StagingDir,
    redelivered_ids,
    staged_name,
)


def test_only_messages_marked_redelivered_are_listed() -> None:
    msgs = [Message("a", {}, {"redelivered": True}), Message("b", {}, {"redelivered": False}),
            Message("c", {}), Message(7, {}, {"redelivered": 1})]
    assert redelivered_ids(msgs) == ["a", "7"]


def test_the_ids_travel_in_the_footer_of_a_marked_file_only(tmp_path) -> None:
    staging = StagingDir(str(tmp_path / "b"))
    table = pa.table({"seq": [1, 2, 3], "message_id": ["a", "b", "c"]})
    plain, marked = staged_name("bp_0", 5), staged_name("bp_0", 6, again=True)
    assert plain == "bp_0-5.parquet" and marked == "bp_0-6.again.parquet"
    staging.write(table, plain)
    staging.write(table, marked, ["b", "c"])
    assert staging.again(plain) == []
    assert staging.again(marked) == ["b", "c"]
    # the rows are untouched, and a rewrite of what was read keeps the ids
    back = staging.read(marked)
    assert back.column("message_id").to_pylist() == ["a", "b", "c"]
    staging.write(back.filter(pa.array([True, False, True])), marked)
    assert staging.again(marked) == ["b", "c"]
    # a batch processor's leftovers are still swept by its prefix
    assert staging.sweep("bp_0-") == 2
