"""The values a handler commonly returns cross every stage with their type; one the wire
cannot carry fails that message alone, in one line naming it, and nothing crashes.

Real processes: spool → two processors (the handler returns datetime with and without a
zone, date, time, Decimal, UUID, bytes, nested lists and dicts, a tuple) → a batcher →
a batch processor whose ``handle_batch`` records the type of every value it got.  One
message carries a set: it fails (``handle_failed`` sees it, the log names its id and the
field), the others are handled, and no stage restarts.
"""

from __future__ import annotations

from pathlib import Path

from tests.e2e.handlers import read_records
from tests.e2e.test_contract import _restarts, _spool
from tests.e2e.test_pipeline import make_config, run_until_idle
from tests.e2e.value_handlers import _types, values

HANDLER = "tests.e2e.value_handlers:Values"


def test_values_cross_every_stage_with_their_type_and_a_set_fails_alone(short_tmp: Path
                                                                        ) -> None:
    n, bad = 60, 17
    _spool(short_tmp, [{"seq": i, "bad": i == bad} for i in range(n)])
    config = make_config(short_tmp, handler=HANDLER, batchers={
        "default": {"batch_size": 10, "batch_timeout": 0.1}})
    proc = run_until_idle(config)
    out = str(short_tmp / "out")
    handled = {r["id"]: r for r in read_records(out, "batch-")}
    failed = read_records(out, "failed-")
    bad_id = f"part-000.jsonl:{bad + 1}"
    assert set(handled) == {f"part-000.jsonl:{i + 1}" for i in range(n) if i != bad}, \
        proc.stderr[-3000:]
    for i in range(n):
        if i == bad:
            continue
        record = handled[f"part-000.jsonl:{i + 1}"]
        expected = values(i)
        expected["nested"]["pair"] = list(expected["nested"]["pair"])   # a tuple is a list
        assert record["types"] == _types(expected)
        assert record["repr"] == repr(expected)     # the same values: offsets kept too
    # the set fails its message alone, with the field named, in handle_failed and the log
    assert [f["id"] for f in failed] == [bad_id]
    assert "data['nested']['tags'] is a set" in failed[0]["reason"]
    lines = [x for x in proc.stderr.splitlines() if bad_id in x]
    assert len(lines) == 1 and "data['nested']['tags'] is a set" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert _restarts(proc.stderr) == []
    # and the run drained: nothing left unacked in the spool
    assert not list((short_tmp / "spool").glob("*.jsonl"))
    assert proc.returncode in (0, 3), proc.stderr[-3000:]  # 3: some messages failed
