"""``run --until-idle`` exits with a code that tells the truth about the run
(docs/operations.md): 0 every message written and acked, 3 the run finished but some
messages failed, 1 messages are left unacked at the source.  It used to exit 0 after
``0 messages acked, 200 failed`` and with a source that still owed everything."""

from __future__ import annotations

import json
from pathlib import Path

from tests.e2e.handlers import read_records
from tests.e2e.test_pipeline import make_config, run_until_idle, write_spool

BATCHERS = {"default": {"batch_size": 50, "batch_timeout": 0.2}}


def test_every_message_acked_exits_0(short_tmp: Path) -> None:
    write_spool(short_tmp / "spool", 200, files=1, extra={"route": "default"})
    proc = run_until_idle(make_config(short_tmp, batchers=BATCHERS))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "e2e: 200 messages acked, 0 failed" in proc.stdout, proc.stdout


def test_every_message_failed_exits_3_and_says_why(short_tmp: Path) -> None:
    write_spool(short_tmp / "spool", 200, files=1, extra={"fail": True, "route": "default"})
    proc = run_until_idle(make_config(short_tmp, batchers=BATCHERS))
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    assert "e2e: 0 messages acked, 200 failed" in proc.stdout, proc.stdout
    line = [ln for ln in proc.stderr.splitlines() if "--until-idle:" in ln]
    assert len(line) == 1 and "200 of them failed" in line[0] and "exiting 3" in line[0], \
        proc.stderr[-3000:]
    assert len(read_records(str(short_tmp / "out"), "failed-")) == 200
    assert "Traceback" not in proc.stderr


def test_some_failed_exits_3(short_tmp: Path) -> None:
    spool = short_tmp / "spool"
    spool.mkdir()
    (spool / "a.jsonl").write_text("".join(
        json.dumps({"seq": i, **({"fail": True} if i == 7 else {})}) + "\n" for i in range(30)))
    proc = run_until_idle(make_config(short_tmp, batchers=BATCHERS))
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    assert "e2e: 29 messages acked, 1 failed" in proc.stdout, proc.stdout


def test_a_source_that_still_owes_messages_exits_1(short_tmp: Path) -> None:
    """Everything handled, but the source's books say 10 of 100 were never settled."""
    config = make_config(short_tmp, batchers=BATCHERS, source="tests.e2e.owing_source:OwingSource",
                         options={"count": 100, "lose_every": 10})
    proc = run_until_idle(config)
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    assert "10 left unacked at the source" in proc.stdout, proc.stdout
    line = [ln for ln in proc.stderr.splitlines() if "--until-idle:" in ln]
    assert len(line) == 1 and "10 message(s) left unacked" in line[0] \
        and "exiting 1" in line[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
