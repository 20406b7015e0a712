"""The spool source in-process: every line once, bad lines, durable acks, dead letters,
finished files moved aside, the split among producers, requeue, new files, options."""

from __future__ import annotations

import json
import os
import zlib
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from offbroadway.stages.sources import SourceOptionError, get_source
from offbroadway.stages.sources.base import failure_of

from .conftest import SpoolDirs, by_key, drain, keys


def test_every_line_once_in_file_and_line_order(spool: SpoolDirs) -> None:
    spool.write("b.jsonl", [{"n": i} for i in range(5)])
    spool.write("a.jsonl", [{"n": i} for i in range(3)])
    spool.write("notes.txt", ["ignored"])                 # not *.jsonl
    (spool.path / "dir.jsonl").mkdir()                    # not a file
    src = spool.source()
    assert src.fileno() is None
    items = drain(src, n=2)
    assert keys(items) == [("a.jsonl", i) for i in range(1, 4)] + \
        [("b.jsonl", i) for i in range(1, 6)]
    assert [it[1] for it in items][:3] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert [it[0] for it in items][:2] == ["a.jsonl:1", "a.jsonl:2"]
    assert all("error" not in it[2] for it in items)
    assert src.exhausted()
    assert src.stats()["fetched"] == 8 and src.stats()["unacked"] == 8


def test_blank_lines_skipped_values_of_any_json_type(spool: SpoolDirs) -> None:
    spool.write("x.jsonl", ['{"a": 1}', "", "   ", "\t", "[1, 2]", '"s"', "3.5", "null",
                            '  {"padded": true}  '], raw=True)
    items = drain(spool.source())
    assert [(it[2]["line"], it[1]) for it in items] == [
        (1, {"a": 1}), (5, [1, 2]), (6, "s"), (7, 3.5), (8, None), (9, {"padded": True})]


def test_crlf_no_trailing_newline_bom_and_unicode(spool: SpoolDirs) -> None:
    (spool.path / "w.jsonl").write_bytes(
        b'\xef\xbb\xbf{"a": 1}\r\n{"b": "\xc3\xa9"}\r\n{"c": 3}')
    items = drain(spool.source())
    assert [it[1] for it in items] == [{"a": 1}, {"b": "é"}, {"c": 3}]
    assert [it[2]["line"] for it in items] == [1, 2, 3]


def test_bad_lines_are_delivered_as_failed_messages(spool: SpoolDirs) -> None:
    (spool.path / "bad.jsonl").write_bytes(
        b'{"ok": 1}\n{not json\n{"a": 1} {"b": 2}\n\xff\xfe{"x": 1}\n{"ok": 2}\n')
    items = drain(spool.source())
    errors = {it[2]["line"]: failure_of(it) for it in items}
    assert all(set(it[2]) == {"file", "line"} for it in items)
    assert errors[1] is None and errors[5] is None
    assert errors[2].startswith("line is not valid JSON: ")
    assert errors[3].startswith("line is not valid JSON: Extra data")
    assert "UTF-8" in errors[4]
    assert by_key(items)[("bad.jsonl", 2)][1] == "{not json"   # the text, for handle_failed
    assert isinstance(by_key(items)[("bad.jsonl", 4)][1], str)
    assert all(it[0] == f"bad.jsonl:{it[2]['line']}" for it in items)


def test_acked_lines_are_not_read_again_after_restart(spool: SpoolDirs) -> None:
    spool.write("a.jsonl", [{"n": i} for i in range(10)])
    src = spool.source()
    items = by_key(drain(src))
    src.ack([items[("a.jsonl", n)][3] for n in (1, 2, 3, 7)])
    src.close()                                       # no clean-up of its own: like a crash
    again = drain(spool.source())
    assert keys(again) == [("a.jsonl", n) for n in (4, 5, 6, 8, 9, 10)]
    record = (spool.state / "spool" / "a.jsonl.acked").read_text()
    assert "1-3 7" in record


def test_finished_file_moves_to_done_and_record_goes(spool: SpoolDirs) -> None:
    spool.write("a.jsonl", [{"n": i} for i in range(3)])
    spool.write("b.jsonl", [{"n": 0}])
    src = spool.source()
    items = drain(src)
    a = [it[3] for it in items if it[2]["file"] == "a.jsonl"]
    src.ack(a[:2])
    assert (spool.path / "a.jsonl").exists()
    src.ack(a[2:])
    assert not (spool.path / "a.jsonl").exists()
    assert (spool.done / "a.jsonl").read_text().count("\n") == 3
    assert not (spool.state / "spool" / "a.jsonl.acked").exists()
    assert (spool.path / "b.jsonl").exists()
    assert src.stats()["files_done"] == 1 and src.stats()["unacked"] == 1


def test_same_name_again_is_a_new_file_and_done_names_never_clash(spool: SpoolDirs) -> None:
    spool.write("a.jsonl", [{"v": 1}])
    src = spool.source()
    src.ack([h for *_, h in drain(src)])
    spool.write("a.jsonl", [{"v": 2}, {"v": 3}])
    items = drain(src)
    assert [it[1] for it in items] == [{"v": 2}, {"v": 3}]
    src.ack([h for *_, h in items])
    assert sorted(p.name for p in spool.done.iterdir()) == ["a.1.jsonl", "a.jsonl"]


def test_blank_only_file_is_finished_at_once(spool: SpoolDirs) -> None:
    spool.write("empty.jsonl", ["", "  "], raw=True)
    (spool.path / "zero.jsonl").write_bytes(b"")
    src = spool.source()
    assert drain(src) == []
    assert sorted(p.name for p in spool.done.iterdir()) == ["empty.jsonl", "zero.jsonl"]


def test_failed_lines_go_to_dead_letter_and_settle(spool: SpoolDirs) -> None:
    spool.write("a.jsonl", ['{"n": 1}', "{broken", '{"n": 3}'], raw=True)
    src = spool.source()
    items = by_key(drain(src))
    src.fail([(items[("a.jsonl", 2)][3], failure_of(items[("a.jsonl", 2)])),
              (items[("a.jsonl", 3)][3], "handler raised KeyError")])
    entries = [json.loads(line) for line in spool.dead_letter.read_text().splitlines()]
    assert [(e["file"], e["line"], e["text"]) for e in entries] == [
        ("a.jsonl", 2, "{broken"), ("a.jsonl", 3, '{"n": 3}')]
    assert entries[0]["reason"].startswith("line is not valid JSON")
    assert entries[1]["reason"] == "handler raised KeyError"
    assert entries[1]["pipeline"] == "test" and entries[1]["producer"] == 0
    assert src.stats()["failed"] == 2
    src.ack([items[("a.jsonl", 1)][3]])
    assert (spool.done / "a.jsonl").exists()
    # settled twice is settled once: late duplicates change nothing
    src.fail([(items[("a.jsonl", 2)][3], "again")])
    src.ack([items[("a.jsonl", 1)][3]])
    assert len(spool.dead_letter.read_text().splitlines()) == 2
    assert src.stats()["acked"] == 1 and src.stats()["failed"] == 2


def test_failed_lines_are_not_read_again_after_restart(spool: SpoolDirs) -> None:
    spool.write("a.jsonl", [{"n": i} for i in range(4)])
    src = spool.source()
    items = drain(src)
    src.fail([(items[1][3], "no")])
    src.close()
    assert keys(drain(spool.source())) == [("a.jsonl", 1), ("a.jsonl", 3), ("a.jsonl", 4)]


def test_requeue_redelivers_before_new_lines(spool: SpoolDirs) -> None:
    spool.write("a.jsonl", [{"n": i} for i in range(6)])
    src = spool.source()
    first = src.fetch(4)
    src.ack([first[0][3]])
    src.requeue([first[3][3], first[1][3], first[0][3]])   # line 1 is settled: not again
    assert not src.exhausted()
    again = src.fetch(3)
    assert keys(again) == [("a.jsonl", 2), ("a.jsonl", 4), ("a.jsonl", 5)]
    assert again[0][1] == {"n": 1} and again[0][0] == "a.jsonl:2"
    assert src.stats()["requeued"] == 2
    rest = drain(src)
    assert keys(rest) == [("a.jsonl", 6)]
    src.ack([h for *_, h in again + rest] + [first[2][3]])
    assert (spool.done / "a.jsonl").exists() and src.stats()["unacked"] == 0


def test_requeued_bad_line_keeps_its_error(spool: SpoolDirs) -> None:
    spool.write("a.jsonl", ["nope"], raw=True)
    src = spool.source()
    (item,) = drain(src)
    src.requeue([item[3]])
    (again,) = drain(src)
    assert failure_of(again) == failure_of(item) and again[3] == item[3]


def test_two_producers_partition_the_files(spool: SpoolDirs) -> None:
    for f in range(12):
        spool.write(f"part-{f:02d}.jsonl", [{"f": f, "i": i} for i in range(5)])
    got = [keys(drain(spool.source(index=i, count=2))) for i in range(2)]
    assert got[0] and got[1], "crc32 split put every file on one producer"
    assert not set(got[0]) & set(got[1])
    assert sorted(got[0] + got[1]) == sorted(
        (f"part-{f:02d}.jsonl", i) for f in range(12) for i in range(1, 6))
    # nothing was acked, so a fresh producer 0 is given exactly the same lines again
    assert keys(drain(spool.source(index=0, count=2))) == got[0]


def test_new_files_are_picked_up_rate_limited(spool: SpoolDirs) -> None:
    spool.write("a.jsonl", [{"n": 1}])
    src = spool.source(scan_interval=3600)
    assert len(drain(src)) == 1
    spool.write("b.jsonl", [{"n": 2}])
    assert src.fetch(10) == []                  # not rescanned yet: within the interval
    assert src.exhausted()
    assert 3500 < src.retry_after() <= 3600
    fresh = spool.source(scan_interval=0)       # a source that may rescan sees it at once
    assert ("b.jsonl", 1) in keys(drain(fresh))


def test_file_that_grows_after_its_end_is_read_on(spool: SpoolDirs) -> None:
    p = spool.write("a.jsonl", [{"n": 1}])
    src = spool.source()
    (first,) = drain(src)
    with p.open("a") as f:
        f.write(json.dumps({"n": 2}) + "\n")
    src.ack([first[3]])                         # last line settled, but the file grew
    assert p.exists()
    (second,) = drain(src)
    assert second[1] == {"n": 2} and second[2]["line"] == 2
    src.ack([second[3]])
    assert (spool.done / "a.jsonl").read_text().count("\n") == 2


def test_big_file_is_read_in_chunks(spool: SpoolDirs) -> None:
    n = 100_000
    spool.write("big.jsonl", ({"i": i, "pad": "x" * 40} for i in range(n)))
    src = spool.source()
    total = 0
    last = 0
    while batch := src.fetch(5000):
        assert batch[0][1]["i"] == last
        last = batch[-1][1]["i"] + 1
        total += len(batch)
        src.ack([h for *_, h in batch])
    assert total == n and src.stats()["files_done"] == 1
    assert src.stats()["bytes_read"] == (spool.done / "big.jsonl").stat().st_size


def test_stale_record_of_an_earlier_file_is_ignored(spool: SpoolDirs) -> None:
    spool.write("a.jsonl", [{"n": i} for i in range(3)])
    src = spool.source()
    src.ack([h for *_, h in drain(src)[:2]])
    src.close()
    os.unlink(spool.path / "a.jsonl")
    spool.write("a.jsonl", [{"m": i} for i in range(3)])   # same name (and likely inode)
    assert len(drain(spool.source())) == 3


def test_record_survives_appends_to_its_file(spool: SpoolDirs) -> None:
    p = spool.write("a.jsonl", [{"n": i} for i in range(3)])
    src = spool.source()
    src.ack([h for *_, h in drain(src)[:2]])
    src.close()
    with p.open("a") as f:
        f.write(json.dumps({"n": 3}) + "\n")
    assert keys(drain(spool.source())) == [("a.jsonl", 3), ("a.jsonl", 4)]


def test_done_record_left_by_a_crash_after_the_move_is_removed(spool: SpoolDirs) -> None:
    records = spool.state / "spool"
    records.mkdir()
    (records / "gone.jsonl.acked").write_text("#offbroadway-spool-acked v1 head=1:9\n1-5\n"
                                              "#done\n")
    (records / "missing.jsonl.acked").write_text("#offbroadway-spool-acked v1 head=1:9\n1-5\n")
    spool.source()
    assert not (records / "gone.jsonl.acked").exists()
    assert (records / "missing.jsonl.acked").exists()    # not marked done: never thrown away


def test_torn_record_is_cut_and_its_lines_read_again(spool: SpoolDirs) -> None:
    p = spool.write("a.jsonl", [{"n": i} for i in range(6)])
    records = spool.state / "spool"
    records.mkdir()
    head = f"{zlib.crc32(p.read_bytes())}:{p.stat().st_size}"
    (records / "a.jsonl.acked").write_text(f"#offbroadway-spool-acked v1 head={head}\n1-2\n4-")
    src = spool.source()
    assert keys(drain(src)) == [("a.jsonl", n) for n in (3, 4, 5, 6)]
    assert (records / "a.jsonl.acked").read_text().endswith("1-2\n")


def test_pattern_and_done_dir_options(spool: SpoolDirs, tmp_path: Path) -> None:
    spool.write("a.ndjson", [{"n": 1}])
    spool.write("b.jsonl", [{"n": 2}])
    src = spool.source(pattern="*.ndjson", done_dir=str(tmp_path / "finished"))
    items = drain(src)
    assert keys(items) == [("a.ndjson", 1)]
    src.ack([items[0][3]])
    assert (tmp_path / "finished" / "a.ndjson").exists()


@pytest.mark.parametrize("options, key", [
    ({}, "path"), ({"path": 3}, "path"), ({"path": "x", "pattern": "a/*.jsonl"}, "pattern"),
    ({"path": "x", "scan_interval": -1}, "scan_interval"), ({"path": "x", "paht": "y"}, "paht"),
    ({"path": "x", "done_dir": "."}, "done_dir"),
])
def test_bad_options_name_the_option(options: dict, key: str, tmp_path: Path) -> None:
    with pytest.raises(SourceOptionError, match=repr(key)) as err:
        get_source("spool")(options, state_dir=str(tmp_path))
    assert err.value.option == key


def test_missing_directory_and_state_dir(tmp_path: Path) -> None:
    src = get_source("spool")({"path": str(tmp_path / "nope")}, state_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"'path'.*not a directory"):
        src.open()
    with pytest.raises(ValueError, match="state_dir"):
        get_source("spool")({"path": str(tmp_path)}, state_dir="")


# -- a property: whatever is settled, in whatever order, a restart yields exactly the rest ----

@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_restart_yields_exactly_the_unsettled_lines(tmp_path_factory: pytest.TempPathFactory,
                                                    data: st.DataObject) -> None:
    spool = SpoolDirs(tmp_path_factory.mktemp("prop"))
    sizes = data.draw(st.lists(st.integers(0, 30), min_size=1, max_size=4), label="sizes")
    for f, size in enumerate(sizes):
        spool.write(f"f{f}.jsonl", [{"f": f, "i": i} for i in range(size)])
    everything = {(f"f{f}.jsonl", i) for f, size in enumerate(sizes) for i in range(1, size + 1)}
    settled: set = set()
    for _run in range(data.draw(st.integers(1, 3), label="runs")):
        src = spool.source()
        items = by_key(drain(src, n=data.draw(st.integers(1, 50), label="n")))
        assert set(items) == everything - settled            # never lost, never read twice
        ops = data.draw(st.lists(st.tuples(st.sampled_from(["ack", "fail", "requeue"]),
                                           st.sampled_from(sorted(items) or [None])),
                                 max_size=40), label="ops")
        for op, key in ops:
            if key is None:
                continue
            h = items[key][3]
            if op == "ack":
                src.ack([h])
                settled.add(key)
            elif op == "fail":
                src.fail([(h, "x")])
                settled.add(key)
            else:
                src.requeue([h])
        redelivered = Counter(keys(drain(src)))
        assert max(redelivered.values(), default=1) == 1
        src.close()
    done = {p.name for p in spool.done.iterdir()} if spool.done.exists() else set()
    for f, size in enumerate(sizes):
        name = f"f{f}.jsonl"
        finished = all((name, i) in settled for i in range(1, size + 1))
        assert (name in done) == finished, name
