"""The pure core of the Spark sink: the group-commit rule, the row conversion, the records
between batch processors and their committer.  No Spark here (see tests/spark)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from offbroadway.stages.spark import spark_rows
from offbroadway.stages.spark.spark_commit import CommitGroups, Handed
from offbroadway.stages.wire import protocol


def handed(peer: str, ref: int, rows: int, at: float, trigger: str = "size") -> Handed:
    return Handed(peer.encode(), ref, rows, trigger, at)


def test_a_job_starts_on_rows_or_on_the_oldest_batchs_age():
    g = CommitGroups(rows=1000, interval=1.0)
    assert not g.ready(0.0) and g.due_at() is None
    g.add(handed("a", 1, 400, at=10.0))
    g.add(handed("b", 1, 400, at=10.5))
    assert not g.ready(10.9)
    assert g.due_at() == 11.0
    assert g.ready(11.0)                       # the oldest waited the interval
    g.add(handed("a", 2, 200, at=10.6))
    assert g.waiting_rows == 1000 and g.ready(10.6)   # enough rows, at once
    job = g.take()
    assert [(h.peer, h.ref) for h in job] == [(b"a", 1), (b"b", 1), (b"a", 2)]
    assert len(g) == 0 and g.waiting_rows == 0 and not g.ready(99.0)


def test_a_flushed_batch_is_committed_without_waiting():
    g = CommitGroups(rows=1000, interval=60.0)
    g.add(handed("a", 1, 10, at=0.0))
    assert not g.ready(1.0)
    g.add(handed("a", 2, 5, at=1.0, trigger="flush"))
    assert g.ready(1.0)
    assert [h.ref for h in g.take()] == [1, 2]
    g.add(handed("a", 3, 5, at=2.0))
    assert not g.ready(2.0), "the flush was counted out with its batch"


def test_a_drained_batch_processors_batches_are_committed_without_waiting():
    """A drain whose last batch was full has no flushed batch: the batch processor's
    DRAINED makes its waiting batches due; another's still wait; a new batch from it
    (a run-again pass) follows the usual rule again."""
    g = CommitGroups(rows=1000, interval=60.0)
    g.add(handed("b", 1, 10, at=0.0))
    assert not g.ready(1.0)
    g.drain(b"a")                    # a batch processor with nothing waiting here
    assert not g.ready(1.0)
    g.add(handed("a", 1, 10, at=1.0))
    g.drain(b"a")
    assert g.ready(1.0)
    assert [h.ref for h in g.take()] == [1, 1]
    g.add(handed("a", 2, 10, at=2.0))
    assert not g.ready(2.0), "handing over again ends the drain's rule"
    g.drain(b"a")
    g.drop_peer(b"a")                # it restarted: its batches and its word are gone
    g.add(handed("b", 2, 10, at=3.0))
    assert not g.ready(3.0)


def test_drained_is_a_frame_of_no_fields():
    msg = protocol.decode(protocol.drained())
    assert msg[protocol.KIND_AT] == protocol.DRAINED and len(msg) == 1


def test_a_job_takes_at_most_max_rows_but_always_one_batch():
    g = CommitGroups(rows=100, interval=1.0, max_rows=250)
    for ref in range(5):
        g.add(handed("a", ref, 100, at=0.0))
    assert [h.ref for h in g.take()] == [0, 1]
    assert [h.ref for h in g.take()] == [2, 3]
    g.add(handed("a", 9, 1000, at=0.0))        # larger than max_rows on its own
    assert [h.ref for h in g.take()] == [4]
    assert [h.ref for h in g.take()] == [9]
    assert g.waiting_rows == 0


def test_a_restarted_batch_processors_waiting_batches_are_forgotten():
    g = CommitGroups(rows=1000, interval=1.0)
    g.add(handed("a", 1, 100, at=0.0))
    g.add(handed("b", 1, 100, at=0.0, trigger="flush"))
    g.add(handed("a", 2, 100, at=0.0))
    assert [h.ref for h in g.drop_peer(b"a")] == [1, 2]
    assert g.waiting_rows == 100 and [h.peer for h in g.take()] == [b"b"]
    g.add(handed("c", 1, 1, at=5.0, trigger="flush"))
    g.drop_peer(b"c")
    g.add(handed("d", 1, 1, at=5.0))
    assert not g.ready(5.0), "the dropped batch's flush no longer counts"


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        CommitGroups(rows=0)


def test_rows_become_one_table_and_misfits_fail_alone():
    schema = spark_rows.infer_schema([{"seq": 1, "name": "a"}])
    rows = [{"seq": 1, "name": "a"}, {"seq": "two", "name": "b"}, {"seq": 3}]
    table, bad = spark_rows.to_table(schema, ["m1", "m2", "m3"], rows)
    assert list(bad) == [1] and "seq" in bad[1]
    assert table.column_names == ["seq", "name", "message_id"]
    assert table.to_pylist() == [{"seq": 1, "name": "a", "message_id": "m1"},
                                 {"seq": 3, "name": None, "message_id": "m3"}]
    assert spark_rows.from_ipc(spark_rows.to_ipc(table)).equals(table)
    none, bad = spark_rows.to_table(schema, ["x"], [{"seq": 1.5}])
    assert none is None and list(bad) == [0]
    assert spark_rows.check_data([1]) and spark_rows.check_data({"message_id": 1})
    assert spark_rows.check_data({"seq": 1}) is None


def test_convert_makes_one_table_and_fails_each_misfit_alone():
    """``convert``: what the batch processor and ``SparkSink.write`` both do with a batch."""
    from offbroadway import Message

    msgs = [Message("a", {"seq": 1, "name": "x"}), Message("b", ["not", "a", "map"]),
            Message("c", {"seq": "two", "name": "y"}), Message("d", {"seq": 4, "name": "z"}),
            Message("e", {"seq": 5}).failed("already failed")]
    rows = spark_rows.convert(msgs, None)
    assert rows.schema is not None and rows.schema.names == ["seq", "name"]
    assert [m.id for m in rows.written] == ["a", "d"]
    assert rows.table.column("message_id").to_pylist() == ["a", "d"]
    assert {m.id for m in rows.failed} == {"b", "c"}
    assert "mapping" in msgs[1].status and "seq" in msgs[2].status
    assert msgs[4].status == "already failed" and msgs[4] not in rows.failed
    # with a schema known, a dict of its columns skips the key-by-key check; anything
    # else still gets it, with the same reasons
    odd = [Message("k1", {"seq": 9}), Message("k2", {"seq": 1, "extra": 1}),
           Message("k3", {"seq": 1, "message_id": "forged"}), Message("k4", {1: 2}),
           Message("k5", ("seq", 1))]
    known = spark_rows.convert(odd, rows.schema)
    assert [m.id for m in known.written] == ["k1"]
    assert "'extra' is not in the schema" in odd[1].status
    assert "reserved column 'message_id'" in odd[2].status
    assert "not a string" in odd[3].status and "mapping" in odd[4].status
    # the schema given wins; a partition column outside it fails every row, said once
    later = [Message("f", {"seq": 6, "name": "w"})]
    again = spark_rows.convert(later, rows.schema, partition_by=("region",))
    assert again.table is None and again.schema is None
    assert later[0].status == "spark: partition_by column 'region' is not in the schema"
    # an error (a DDL Spark cannot parse) fails them all with its reason
    bad = [Message("g", {"seq": 7})]
    assert spark_rows.convert(bad, None, error="spark: bad DDL").failed == bad
    assert bad[0].status == "spark: bad DDL"


def test_conform_brings_a_table_to_the_datasets_schema_or_says_why():
    dataset = pa.schema([pa.field("seq", pa.float64()), pa.field("name", pa.string()),
                         spark_rows.ID_FIELD])
    t = pa.table({"seq": pa.array([1, 2]), "message_id": pa.array(["a", "b"])})
    got = spark_rows.conform(t, dataset)
    assert got.schema.equals(dataset)
    assert got.to_pylist()[0] == {"seq": 1.0, "name": None, "message_id": "a"}
    with pytest.raises(ValueError, match="'extra' is not in the dataset"):
        spark_rows.conform(t.append_column("extra", pa.array([1, 2])), dataset)
    with pytest.raises(ValueError, match="'name' is int64"):
        spark_rows.conform(pa.table({"seq": [1.0], "name": [5], "message_id": ["a"]}),
                           dataset)
    schema = spark_rows.schema_from_ipc(spark_rows.schema_to_ipc(dataset))
    assert schema.equals(dataset)


def test_hand_off_frames_round_trip_and_garbage_is_refused():
    """The Spark hand-off goes through the one codec, with its checks."""
    P = protocol
    assert P.decode(P.hello()) == [P.HELLO]
    msg = P.decode(P.commit(7, "flush", 2, "bp-7.parquet", b"s"))
    assert msg == [P.COMMIT, 7, "flush", 2, "bp-7.parquet", b"s"]
    assert (msg[P.COMMIT_REF], msg[P.COMMIT_TRIGGER], msg[P.COMMIT_ROWS], msg[P.COMMIT_FILE],
            msg[P.COMMIT_SCHEMA]) == (7, "flush", 2, "bp-7.parquet", b"s")
    msg = P.decode(P.result(7, None, None))
    assert (msg[P.RESULT_REF], msg[P.RESULT_ERROR], msg[P.RESULT_SCHEMA]) == (7, None, None)
    msg = P.decode(P.schema(b"s", "bad ddl", "file:///st"))
    assert (msg[P.SCHEMA_IPC], msg[P.SCHEMA_ERROR], msg[P.SCHEMA_STAGING]) == \
        (b"s", "bad ddl", "file:///st")
    for frame in (b"", b"\xc1", P.hello()[:-1] + b"\x09",
                  P.commit(1, "size", 1, "f", b"")[:-3],
                  P.commit(1, "size", "1", "f", b""), P.result("7", None, None),
                  P.schema(b"s", None, None)):
        with pytest.raises(P.ProtocolError):
            P.decode(frame)
