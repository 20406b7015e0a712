"""Dead letters of the spool, seen and replayed: ``offbroadway dead-letters CONFIG
[show | replay]``.

A run fails the orders without a sku (and two lines that are not JSON); the config is
fixed; ``replay --reason 'no sku'`` puts those back in the spool and the next run writes
them: every order written exactly once.  A second replay does nothing, and neither does
the run after it.  A replay interrupted between its steps is finished (or redone) by the
next one, never twice.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

from offbroadway.daemon.cli.deadletters import ReplayRecord
from offbroadway.daemon.core.outcome import EXIT_FAILED
from offbroadway.stages.sources.deadletters import DeadLetter
from offbroadway.stages.sources.spool.replay import SpoolDeadLetters

from tests.conftest import REPO, offbroadway_cmd, test_env
from tests.e2e.replay_handlers import written
from tests.e2e.test_pipeline import make_config, run_until_idle

N = 300
NO_SKU = set(range(0, N, 10))          # 30 orders without a sku
NOT_JSON = 2


def dead_letters(config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(offbroadway_cmd("dead-letters", str(config), *args), cwd=REPO,
                          env=test_env(), capture_output=True, text=True, timeout=60)


def write_orders(spool: Path) -> None:
    spool.mkdir(parents=True)
    lines = [json.dumps({"seq": i, **({} if i in NO_SKU else {"sku": f"s{i}"})})
             for i in range(N)]
    lines[5:5] = ["{not json"] * NOT_JSON
    (spool / "orders.jsonl").write_text("\n".join(lines) + "\n")


def test_failures_are_listed_replayed_once_and_written_once(short_tmp: Path) -> None:
    write_orders(short_tmp / "spool")
    config = make_config(short_tmp, handler="tests.e2e.replay_handlers:Picky",
                         batchers={"default": {"batch_size": 20, "batch_timeout": 0.2}})
    out = short_tmp / "out"
    first = run_until_idle(config)
    assert first.returncode == EXIT_FAILED, first.stderr[-3000:]   # finished, some failed
    assert Counter(written(str(out))) == Counter(set(range(N)) - NO_SKU)

    listed = dead_letters(config)
    assert listed.returncode == 0, listed.stderr
    text = listed.stdout
    assert f"{len(NO_SKU) + NOT_JSON} dead letters in " in text, text
    assert "dead-letter.jsonl" in text and "oldest " in text and "newest " in text, text
    assert f"{len(NO_SKU):>7}  no sku" in text, text
    assert f"{NOT_JSON:>7}  line is not valid JSON" in text, text
    shown = dead_letters(config, "show", "--reason", "no sku", "--limit", "3")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("reason: no sku") == 3 and '"seq": 0' in shown.stdout, shown.stdout
    assert f"and {len(NO_SKU) - 3} more" in shown.stdout, shown.stdout

    # the handler is fixed (a config change), then the letters of that reason replayed
    config.write_text(config.read_text().replace("context = {", "context = { fixed = true,"))
    replayed = dead_letters(config, "replay", "--reason", "no sku")
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout.startswith(f"{len(NO_SKU)} dead letters whose reason contains "
                                      f"'no sku': replayed {len(NO_SKU)} to "), replayed.stdout
    second = run_until_idle(config)
    assert second.returncode == 0, second.stderr[-3000:]
    assert Counter(written(str(out))) == Counter(range(N)), "every order written exactly once"

    # replaying again does nothing, and so does the next run
    again = dead_letters(config, "replay", "--reason", "no sku")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("nothing to replay: no dead letters whose reason contains "
                                   "'no sku' in "), again.stdout
    assert f"({len(NO_SKU)} replayed before)" in again.stdout, again.stdout
    third = run_until_idle(config)
    assert third.returncode == 0, third.stderr[-3000:]
    assert Counter(written(str(out))) == Counter(range(N))
    left = dead_letters(config)
    assert f"{NOT_JSON} dead letters in " in left.stdout, left.stdout
    assert f"({len(NO_SKU)} more replayed before)" in left.stdout, left.stdout


def test_a_source_without_dead_letters_says_so(short_tmp: Path) -> None:
    config = make_config(short_tmp, source="generator", options={"count": 10})
    out = dead_letters(config, "replay")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip().endswith("dead-letters: the generator source keeps no dead "
                                       "letters (its failed messages are counted and "
                                       "dropped)"), out.stderr
    assert "Traceback" not in out.stderr


class Crash(Exception):
    pass


class CrashingRecord(ReplayRecord):
    """A record whose write dies with the process: nothing of it reaches the disk."""

    def record(self, keys, to) -> None:
        raise Crash


def test_an_interrupted_replay_is_finished_or_redone_never_doubled(tmp_path: Path) -> None:
    spool, state = tmp_path / "spool", tmp_path / "state"
    spool.mkdir()
    box = SpoolDeadLetters({"path": str(spool)}, str(state))
    letters = [DeadLetter(key=f"k{i}", reason="r", failed_at=None, origin="f:1",
                          body=json.dumps({"seq": i})) for i in range(3)]
    # crashed before its record: the part file is removed, the letters replayed again
    doomed = CrashingRecord(str(state))
    doomed.lock()
    try:
        box.replay(letters, doomed)
    except Crash:
        pass
    doomed.close()
    assert [p.name for p in spool.iterdir() if p.name.endswith(".part")], "a part file left"
    record = ReplayRecord(str(state))
    record.lock()
    line = box.replay(letters, record)
    record.close()
    files = sorted(p for p in spool.iterdir())
    assert len(files) == 1 and files[0].suffix == ".jsonl", files
    assert files[0].read_text().count("seq") == 3, line
    # crashed after its record, before the rename: the next replay renames it in
    part = spool / f".replay-{files[0].name}.part"
    files[0].rename(part)
    record = ReplayRecord(str(state))
    record.lock()
    line = box.replay([], record)
    record.close()
    assert "renamed in " in line and (spool / files[0].name).exists() and not part.exists()
