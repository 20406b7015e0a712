"""``offbroadway test CONFIG FIXTURES``: fixture lines through the configured handler,
routing, batching and (with [spark]) the conversion to rows, in one process; exit 0/3 as
``run --until-idle``; ``--expect`` for CI."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.conftest import REPO, offbroadway_cmd, test_env


def config(tmp: Path, spark: bool = True, handler: str = "examples.orders:Orders") -> Path:
    (tmp / "spool").mkdir(exist_ok=True)
    text = f"""
[pipeline]
name = "t"
handler = "{handler}"
context = {{ batcher = "spark" }}
[producer]
source = "spool"
[producer.options]
path = "{tmp / 'spool'}"
[batchers.spark]
batch_size = 2
[runtime]
dir = "{tmp / 'run'}"
state_dir = "{tmp / 'state'}"
"""
    if spark:
        text += f'[spark]\noutput = "{tmp / "out"}"\n'
    path = tmp / "p.toml"
    path.write_text(text)
    return path


LINES = ['{"sku": "fig", "qty": 2, "unit_price": 1.5}', '{"qty": 1}', 'not json',
         '{"sku": "kiwi", "qty": 3, "unit_price": 0.25}']


def test(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(offbroadway_cmd("test", *args), cwd=REPO, env=test_env(),
                          capture_output=True, text=True, timeout=120)


test.__test__ = False   # type: ignore[attr-defined]


def test_rows_schema_and_failures_with_spark(tmp_path: Path) -> None:
    (tmp_path / "orders.jsonl").write_text("\n".join(LINES) + "\n")
    out = test(str(config(tmp_path)), str(tmp_path / "orders.jsonl"))
    assert out.returncode == 3, out.stderr
    lines = out.stdout.splitlines()
    start = lines.index("rows for spark (2):")
    rows = [json.loads(line) for line in lines[start + 1:start + 3]]
    assert rows == [
        {"sku": "fig", "qty": 2, "unit_price": 1.5, "total": 3.0,
         "message_id": "orders.jsonl:1"},
        {"sku": "kiwi", "qty": 3, "unit_price": 0.25, "total": 0.75,
         "message_id": "orders.jsonl:4"}]
    assert lines[start + 3] == ("schema for spark (inferred): sku string, qty bigint, "
                                "unit_price double, total double, message_id string, "
                                "ingested_at timestamp")
    assert "failed (2):" in lines
    assert "  orders.jsonl:2: not an order: needs sku and qty" in lines
    assert ("  orders.jsonl:3: line is not valid JSON: Expecting value: line 1 column 1 "
            "(char 0)") in lines


def test_expect_compares_rows_in_any_order(tmp_path: Path) -> None:
    (tmp_path / "fx").mkdir()
    (tmp_path / "fx" / "a.jsonl").write_text(LINES[0] + "\n")
    (tmp_path / "fx" / "b.jsonl").write_text(LINES[3] + "\n")
    expect = tmp_path / "expect.jsonl"
    expect.write_text('{"sku": "kiwi", "total": 0.75}\n{"sku": "fig", "total": 3.0}\n')
    cfg = str(config(tmp_path))
    out = test(cfg, str(tmp_path / "fx"), "--expect", str(expect))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rows as expected (2)" in out.stdout
    expect.write_text('{"sku": "kiwi", "total": 0.8}\n{"sku": "fig", "total": 3.0}\n')
    out = test(cfg, str(tmp_path / "fx"), "--expect", str(expect))
    assert out.returncode == 1
    assert 'missing from spark: {"sku": "kiwi", "total": 0.8}' in out.stdout
    assert ('not expected in spark: {"sku": "kiwi", "qty": 3, "unit_price": 0.25, '
            '"total": 0.75, "message_id": "b.jsonl:1"}') in out.stdout


def test_without_spark_the_rows_are_what_handle_batch_returned(tmp_path: Path) -> None:
    (tmp_path / "orders.jsonl").write_text(LINES[0] + "\n")
    out = test(str(config(tmp_path, spark=False)), str(tmp_path / "orders.jsonl"))
    assert out.returncode == 0, out.stderr
    assert "rows for spark (1):" in out.stdout and "schema for" not in out.stdout
    assert "failed (0):" in out.stdout


def test_a_fixture_path_that_is_not_there_is_one_line(tmp_path: Path) -> None:
    out = test(str(config(tmp_path)), str(tmp_path / "nope.jsonl"))
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "nope.jsonl: no such file or directory" in out.stderr
