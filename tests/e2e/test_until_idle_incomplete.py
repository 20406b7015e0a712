"""``--until-idle`` exits 0 only when every message is written and acked.

A drain that cannot finish within ``shutdown_timeout`` (here: batches slower than the
timeout) used to end with "drain complete"-style silence and exit 0, with lines still
unacked in the spool.  Now it says so in one line and exits 1; the lines stay at the source
and a second run writes them.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.e2e.handlers import read_records
from tests.e2e.test_pipeline import make_config, run_until_idle, write_spool


def test_a_drain_that_outlasts_shutdown_timeout_exits_1_and_loses_nothing(
        short_tmp: Path) -> None:
    n = 400
    write_spool(short_tmp / "spool", n, files=1, extra={"route": "default"})
    # every batch takes 3 s in handle_batch; the drain gets 1 s
    config = make_config(short_tmp, handler="tests.e2e.handlers:Contract",
                         context={"batch_slow": 3.0}, shutdown_timeout=1.0,
                         batchers={"default": {"batch_size": 100, "batch_timeout": 0.2}})
    first = run_until_idle(config, timeout=180)
    assert first.returncode == 1, first.stderr[-3000:]
    line = [x for x in first.stderr.splitlines() if "--until-idle: the drain did not finish"
            in x]
    assert len(line) == 1 and "shutdown_timeout 1s" in line[0], first.stderr[-3000:]
    assert "Traceback" not in first.stderr
    left = sum(len(f.read_text().splitlines()) for f in (short_tmp / "spool").glob("*.jsonl"))
    assert left > 0, "the slow batches were acked after all: the test proves nothing"

    # the same pipeline with fast batches: everything not acked the first time is written
    config.write_text(config.read_text().replace("batch_slow = 3.0", "batch_slow = 0.0")
                      .replace("shutdown_timeout = 1.0", "shutdown_timeout = 30.0"))
    second = run_until_idle(config, timeout=180)
    assert second.returncode == 0, second.stderr[-3000:]
    handled = Counter(r["id"] for r in read_records(str(short_tmp / "out"), "batch-"))
    assert len(handled) == n, f"{n - len(handled)} lines never handled"
    assert not list((short_tmp / "spool").glob("*.jsonl")), "lines left unacked"
