"""A slow handler is not a crash; a hung process still is.

A ``handle_message`` that waits on an external call for longer than ``heartbeat_timeout``
used to be killed as silent (``silent for 2.0s (heartbeat_timeout 2s): killing``), counted
a poison strike against a healthy message, and restarted every processor.  Now the stage's
liveness thread beats while a callback runs (stages/runtime/liveness.py): the call finishes, the
message is handled once, nothing restarts.  ``message_timeout`` bounds one call: it fails
that message alone, and the rest of its frame goes on.  A process that cannot run at all
(here: a C call that holds the GIL) is still silent, and still killed.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

from offbroadway.daemon.core.outcome import EXIT_FAILED

from tests.e2e.handlers import read_records
from tests.e2e.test_pipeline import make_config, run_until_idle

N = 40
SLOW_AT = 5


def spool_with(tmp: Path, slow: dict) -> None:
    spool = tmp / "spool"
    spool.mkdir()
    (spool / "a.jsonl").write_text("".join(
        json.dumps({"seq": i, **(slow if i == SLOW_AT else {})}) + "\n" for i in range(N)))


def config_with(tmp: Path, processor_keys: str) -> Path:
    # one processor, one frame: the slow message's neighbours share its frame
    config = make_config(tmp, handler="tests.e2e.slow_handlers:Slow", processors=1,
                         max_demand=100)
    config.write_text(config.read_text().replace(
        "[processors.default]\n", f"[processors.default]\n{processor_keys}\n"))
    return config


def test_a_call_longer_than_heartbeat_timeout_is_not_killed(short_tmp: Path) -> None:
    spool_with(short_tmp, {"sleep": 6})
    proc = run_until_idle(config_with(short_tmp, "heartbeat_timeout = 2"), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "silent for" not in proc.stderr and "killing" not in proc.stderr, proc.stderr[-3000:]
    assert "requeued" not in proc.stderr and "poison" not in proc.stderr, proc.stderr[-3000:]
    handled = Counter(r["id"] for r in read_records(str(short_tmp / "out"), "handled-"))
    assert len(handled) == N and max(handled.values()) == 1, handled
    assert "e2e: 40 messages acked, 0 failed" in proc.stdout, proc.stdout


def test_message_timeout_fails_that_message_alone(short_tmp: Path) -> None:
    spool_with(short_tmp, {"sleep": 600})
    started = time.monotonic()
    proc = run_until_idle(config_with(short_tmp, "message_timeout = 1.5"), timeout=120)
    took = time.monotonic() - started
    assert proc.returncode == EXIT_FAILED, (proc.returncode, proc.stderr[-3000:])   # one failed
    out = str(short_tmp / "out")
    failed = {r["id"]: r["reason"] for r in read_records(out, "failed-")}
    assert list(failed) == [f"a.jsonl:{SLOW_AT + 1}"], failed
    assert failed[f"a.jsonl:{SLOW_AT + 1}"] == \
        "handle_message raised MessageTimeout: ran past message_timeout 1.5s", failed
    handled = Counter(r["id"] for r in read_records(out, "handled-"))
    assert len(handled) == N - 1 and max(handled.values()) == 1, handled
    assert "silent for" not in proc.stderr and "requeued" not in proc.stderr, proc.stderr[-3000:]
    assert took < 60, f"the run took {took:.0f}s: the slow call was not cut at its deadline"


def test_a_process_that_cannot_run_is_still_killed(short_tmp: Path) -> None:
    """The GIL held in C code for 600 s: no thread runs, the watchdog ends the process and
    the message that hung it is struck (max_crashes 1: failed as poison at once)."""
    spool_with(short_tmp, {"hold_gil": 600})
    proc = run_until_idle(config_with(short_tmp, "heartbeat_timeout = 2\nmax_crashes = 1"),
                          timeout=180)
    assert "silent for" in proc.stderr and "heartbeat_timeout 2s" in proc.stderr, \
        proc.stderr[-3000:]
    assert proc.returncode == EXIT_FAILED, (proc.returncode, proc.stderr[-3000:])
    out = str(short_tmp / "out")
    failed = {r["id"]: r["reason"] for r in read_records(out, "failed-")}
    assert list(failed) == [f"a.jsonl:{SLOW_AT + 1}"] and "poison" in failed[
        f"a.jsonl:{SLOW_AT + 1}"], failed
    handled = {r["id"] for r in read_records(out, "handled-")}
    assert len(handled) == N - 1, sorted(handled)
