"""``--until-idle`` exits 0 only when every message is written and acked.

A producer that dies after it said idle has its lines in flight back at the source: the
drain waits for its successor to read them.

A drain that cannot finish within ``shutdown_timeout`` (here: batches slower than the
timeout) used to end with "drain complete"-style silence and exit 0, with lines still
unacked in the spool.  Now it says so in one line and exits 1; the lines stay at the source
and a second run writes them.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from collections import Counter
from pathlib import Path

from tests.conftest import env_with_site, wait_until
from tests.e2e.handlers import read_records
from tests.e2e.test_contract import _node, _status
from tests.e2e.test_counts_truth import _ledger_acked
from tests.e2e.test_pipeline import make_config, run_until_idle, run_until_idle_while, write_spool


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


#: every stage of the daemon starts with this ``sitecustomize``: armed by a file, the next
#: spool source to open (the killed producer's successor) waits until the test releases it
HOLD_OPEN = textwrap.dedent("""
    import os, time

    _dir = os.environ.get("OB_TEST_HOLD_OPEN")
    if _dir:
        from offbroadway.stages.sources.spool.source import SpoolSource

        _real = SpoolSource.open

        def open(self):
            try:
                os.rename(os.path.join(_dir, "armed"), os.path.join(_dir, "held"))
            except OSError:
                return _real(self)
            deadline = time.monotonic() + 120
            while not os.path.exists(os.path.join(_dir, "released")) \\
                    and time.monotonic() < deadline:
                time.sleep(0.02)
            return _real(self)

        SpoolSource.open = open
""")


N_LINES = 3000


def test_a_producer_killed_after_it_said_idle_reads_its_lines_before_the_drain(
        short_tmp: Path) -> None:
    """Two producers, one file each.  ``producer_0`` has read its file to the end (so it
    says idle, its last lines in flight) and is SIGKILLed; its successor is held at its
    start while ``producer_1`` reads the rest of its file and says idle too.  The dead
    producer's idle must not count: a drain begun then would tell the successor to drain
    at its hello, before it read the lines that died in flight, and exit 0 with them
    still in the spool."""
    spool = short_tmp / "spool"
    spool.mkdir()
    # crc32(name) % 2 gives a.jsonl to producer_0 and b.jsonl to producer_1
    (spool / "a.jsonl").write_text("".join(json.dumps({"seq": i}) + "\n" for i in range(60)))
    (spool / "b.jsonl").write_text("".join(json.dumps({"seq": i}) + "\n"
                                           for i in range(60, N_LINES)))
    hold = short_tmp / "hold"
    hold.mkdir()
    env = env_with_site(short_tmp, HOLD_OPEN, OB_TEST_HOLD_OPEN=str(hold))
    config = make_config(short_tmp, handler="tests.e2e.handlers:Contract", producers=2,
                         context={"batch_slow": 0.1},
                         batchers={"default": {"batch_size": 20, "batch_timeout": 0.1,
                                               "concurrency": 2}})
    sock = short_tmp / "run" / "control.sock"

    def source(st: dict, producer: str) -> dict:
        return _node(st.get("tree", {}), producer).get("messages", {}).get("source", {})

    def idle(st: dict, producer: str) -> bool:
        """What the producer says idle on: its source read to the end, nothing buffered."""
        node = _node(st.get("tree", {}), producer).get("messages", {})
        return bool(node.get("source", {}).get("exhausted")) and node.get("buffered") == 0

    def kill_and_hold() -> None:
        st = wait_until(lambda: (s := _status(sock)) and source(s, "producer_0").get(
            "exhausted") and s, timeout=60, interval=0.05,
            message="producer_0 to read its file to the end")
        assert not source(st, "producer_1").get("exhausted"), "producer_1 idle already"
        (hold / "armed").touch()
        os.kill(_node(st["tree"], "producer_0")["pid"], signal.SIGKILL)
        # the spool's own record: lines of a.jsonl died in flight (none can settle now)
        assert _ledger_acked(short_tmp, "a.jsonl") < 60, "a.jsonl settled before the kill"
        wait_until(lambda: (hold / "held").exists(), timeout=30, interval=0.02,
                   message="the successor held at its start")
        wait_until(lambda: idle(_status(sock), "producer_1"), timeout=60, interval=0.05,
                   message="producer_1 to read its file to the end")
        # its idle report follows within a watch (0.2 s): a drain would begin at once
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            assert not _status(sock).get("draining"), "the drain began without producer_0"
        (hold / "released").touch()

    code, out, err = run_until_idle_while(config, kill_and_hold, env=env)
    assert code == 0, err[-3000:]
    assert not list(spool.glob("*.jsonl")), f"lines left unacked: {err[-3000:]}"
    handled = Counter(r["id"] for r in read_records(str(short_tmp / "out"), "batch-"))
    assert len(handled) == N_LINES, f"{N_LINES - len(handled)} lines never handled"
    summary = [ln for ln in out.splitlines() if "messages acked" in ln]
    assert summary == [f"e2e: {N_LINES} messages acked, 0 failed"], out + err[-3000:]
