"""Poison messages: a message whose handler kills the processor process itself is run
``max_crashes`` times, then failed through ``handle_failed`` to the source's dead letters,
while the good messages around it flow and the daemon keeps running and drains to exit 0.

The handler appends each poison delivery to a file (fsync'd) before it dies, so the crash
count is the handler's own, not the daemon's.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from offbroadway.supervision.tree import snapshot_find

from tests.conftest import REPO, offbroadway_cmd, start_daemon, test_env, wait_until
from tests.e2e.handlers import read_records
from tests.e2e.test_pipeline import make_config

GOOD = 300
POISON_AT = 137
MAX_CRASHES = 3


def write_poisoned_spool(spool: Path, kind: str, n: int = GOOD, at: int = POISON_AT) -> str:
    """``n`` good lines with one poison line among them; returns the poison's message id."""
    spool.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"seq": i}) for i in range(n)]
    lines.insert(at, json.dumps({"seq": "poison", "poison": kind}))
    (spool / "part-000.jsonl").write_text("\n".join(lines) + "\n")
    return f"part-000.jsonl:{at + 1}"


def poison_config(tmp: Path, handler: str, *, memory_limit: str | None = None,
                  batchers: dict | None = None) -> Path:
    config = make_config(tmp, handler=handler, batchers=batchers)
    extra = f"max_crashes = {MAX_CRASHES}\n"
    if memory_limit:
        extra += f'memory_limit = "{memory_limit}"\n'
    text = config.read_text().replace("[processors.default]\n", "[processors.default]\n" + extra)
    config.write_text(text)
    return config


def status(tmp: Path) -> dict:
    out = subprocess.run(offbroadway_cmd("status", "--json", "--socket",
                                         str(tmp / "run" / "control.sock")),
                         cwd=REPO, env=test_env(), capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def dead_letters(tmp: Path) -> list[dict]:
    path = tmp / "state" / "spool" / "dead-letter.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def deliveries(tmp: Path) -> list[dict]:
    return read_records(str(tmp / "out"), "poison-deliveries")


def run_poisoned(tmp: Path, config: Path, poison_id: str, handled_prefix: str, *,
                 isolation: bool = False) -> str:
    """Run the daemon until the poison is dead-lettered and every good line handled,
    check it is still running, stop it; returns its stderr."""
    daemon = start_daemon(config)
    out = tmp / "out"
    try:
        wait_until(lambda: dead_letters(tmp), timeout=45, interval=0.1,
                   message="the poison message to be dead-lettered")
        handled = wait_until(
            lambda: (h := {r["id"] for r in read_records(str(out), handled_prefix)})
            and len(h) >= GOOD and h, timeout=30, interval=0.1,
            message="every good message to be handled")
        assert daemon.poll() is None, "the daemon gave up"
        # the producer's counters reach status (one stats tick later)
        producer = wait_until(
            lambda: (p := (snapshot_find(status(tmp)["tree"], "producer_0") or {})
                     .get("messages", {})).get("poison_failed") and p,
            timeout=10, message="producer counters")
        assert producer["poison_strikes"] == MAX_CRASHES
        assert producer["poison_failed"] == 1
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            code = daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            raise
    err = daemon.stderr.read()
    assert code == 0, err[-3000:]
    assert poison_id not in handled
    assert len(handled) == GOOD, "a good message was lost"
    # read as a list, not a set: a good message runs again only if a crash's requeue handed
    # it back, so duplicates stay within what the requeues (each logs its count) took
    counts = Counter(r["id"] for r in read_records(str(out), handled_prefix))
    requeued = sum(int(k) for k in re.findall(r"requeued (\d+) in-flight messages", err))
    assert sum(c - 1 for c in counts.values()) <= requeued, (counts.most_common(3), requeued)
    # the poison ran exactly max_crashes times, then was failed without running again
    runs = deliveries(tmp)
    if isolation:
        # a prepare_messages frame that died blames nobody yet: its messages run alone
        # next time, so at most one crash in a bigger frame, then max_crashes alone
        assert sum(d["frame"] > 1 for d in runs) <= 1 and runs[0] == max(
            runs, key=lambda d: d["frame"]), runs
        runs = [d for d in runs if d["frame"] == 1]
    ids = [d["id"] for d in runs]
    assert ids == [poison_id] * MAX_CRASHES, ids
    letters = dead_letters(tmp)
    assert len(letters) == 1, letters
    assert f"{letters[0]['file']}:{letters[0]['line']}" == poison_id
    assert "poison" in letters[0]["text"]
    assert f"killed a processor {MAX_CRASHES} times" in letters[0]["reason"]
    # handle_failed saw it, with the same reason, and no good message failed
    failed = read_records(str(out), "failed-")
    # exactly once: a crash cascade requeues once, when all its stages are down, so the
    # poison, emitted failed after it, is never handed back and failed again
    assert [f["id"] for f in failed] == [poison_id]
    assert failed[0]["reason"] == letters[0]["reason"]
    assert f"message {poison_id} is poison" in err
    return err


@pytest.mark.parametrize("kind,how,memory", [
    ("exit", "exited with code 3", None),
    ("segv", "killed by SIGSEGV", None),
    ("memory", "over memory_limit", "150MiB"),
])
def test_a_poison_message_is_dead_lettered_after_max_crashes(short_tmp: Path, kind: str,
                                                            how: str, memory: str | None
                                                            ) -> None:
    poison_id = write_poisoned_spool(short_tmp / "spool", kind)
    config = poison_config(short_tmp, "tests.e2e.poison_handlers:Poisoned",
                           memory_limit=memory)
    run_poisoned(short_tmp, config, poison_id, "handled-")
    letter = dead_letters(short_tmp)[0]
    assert how in letter["reason"], letter["reason"]


# long: not in the default run (pytest -m slow)
@pytest.mark.slow
def test_a_poison_message_with_batchers(short_tmp: Path) -> None:
    """Each crash restarts the batchers too (rest_for_one): still exactly max_crashes."""
    poison_id = write_poisoned_spool(short_tmp / "spool", "exit")
    config = poison_config(short_tmp, "tests.e2e.poison_handlers:PoisonedBatched",
                           batchers={"default": {"batch_size": 50, "batch_timeout": 0.2}})
    run_poisoned(short_tmp, config, poison_id, "batch-")


def test_a_poison_message_in_prepare_messages_is_isolated_first(short_tmp: Path) -> None:
    """The frame it was in is not dead-lettered with it: its neighbours are redelivered one
    per frame, and only the poison, alone, collects crashes.  The poison is the spool's
    fourth line, so it arrives in the first frame, which the processors' whole initial
    demand (max_demand 10) fills: a frame of several messages, every time."""
    poison_id = write_poisoned_spool(short_tmp / "spool", "exit", at=3)
    config = poison_config(short_tmp, "tests.e2e.poison_handlers:PoisonedPrepare")
    err = run_poisoned(short_tmp, config, poison_id, "handled-", isolation=True)
    first = deliveries(short_tmp)[0]
    assert first["id"] == poison_id and first["frame"] > 1, deliveries(short_tmp)
    assert "in prepare_messages of a frame of" in err
