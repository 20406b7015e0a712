"""Your own source (``source = "package.module:Class"``): ``check`` accepts the example
source and refuses broken ones in one line each; the example SQLite queue runs through the
daemon with a processor and then a producer SIGKILLed mid-run, and loses nothing."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import REPO, offbroadway_cmd, start_daemon, test_env, wait_until
from tests.e2e.handlers import read_records
from tests.e2e.test_pipeline import make_config, stage_pids

EXAMPLE = "examples.sqlite_source:SQLiteQueueSource"


def fill(db: Path, n: int, failing: int) -> set[str]:
    """n rows ``{"seq": i}``; every ``failing``th asks the handler to fail it.  Returns the
    ids of the failing ones."""
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY, body TEXT NOT NULL, "
                "leased INTEGER NOT NULL DEFAULT 0)")
    con.executemany("INSERT INTO jobs (id, body) VALUES (?, ?)",
                    [(i, json.dumps({"seq": i, "fail": i % failing == 0}))
                     for i in range(1, n + 1)])
    con.commit()
    con.close()
    return {f"jobs:{i}" for i in range(1, n + 1) if i % failing == 0}


def check(config: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = test_env()
    if pythonpath is not None:
        env["PYTHONPATH"] = f"{pythonpath}{os.pathsep}{env['PYTHONPATH']}"
    return subprocess.run(offbroadway_cmd("check", str(config)), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def test_check_accepts_the_example_and_refuses_broken_sources_in_one_line(
        short_tmp: Path) -> None:
    ok = make_config(short_tmp, source=EXAMPLE, options={"path": str(short_tmp / "q.db")})
    res = check(ok)
    assert res.returncode == 0, res.stderr

    mods = short_tmp / "mods"
    mods.mkdir()
    (mods / "my_sources.py").write_text(textwrap.dedent("""
        from offbroadway.stages.sources.base import Source

        class NotASource:
            pass

        class Half(Source):
            def fetch(self, n): return []
            def ack(self, handles): pass

        class OldInit(Source):
            known_options = None
            def __init__(self, options):
                super().__init__(options)
            def fetch(self, n): return []
            def ack(self, handles): pass
            def fail(self, failures): pass
            def requeue(self, handles): pass
            def exhausted(self): return True
        """))
    (mods / "broken.py").write_text("x = 1 / 0\n")
    cases = {
        "my_sources:NotASource": "is not a subclass of",
        "my_sources:Half": "does not implement fail, requeue, exhausted",
        "my_sources:OldInit": "OldInit(options, ...) raised TypeError",
        "my_sources:Missing": "has no 'Missing'",
        "broken:Thing": "raised ZeroDivisionError",
        "no_such_module:Thing": "No module named 'no_such_module'",
        "kafka": "or 'package.module:ClassName' for your own source",
    }
    for source, fragment in cases.items():
        config = make_config(short_tmp, source=source, options={"x": 1})
        res = check(config, mods)
        assert res.returncode == 2, (source, res.stdout, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in res.stderr, (source, res.stderr)
        assert "producer.source" in lines[0] and fragment in lines[0], (source, lines[0])
    bad_option = make_config(short_tmp, source=EXAMPLE, options={"path": "q.db", "colour": 1})
    res = check(bad_option)
    assert res.returncode == 2 and "producer.options.colour" in res.stderr, res.stderr


def test_example_source_through_the_daemon_with_sigkills_loses_nothing(
        short_tmp: Path) -> None:
    n = 4000
    db = short_tmp / "queue.db"
    expected_failed = fill(db, n, failing=97)
    config = make_config(short_tmp, source=EXAMPLE, producers=2, context={"slow": 0.0005},
                         options={"path": str(db), "poll_interval": 0.05},
                         batchers={"default": {"batch_size": 100, "batch_timeout": 0.3}})
    control = short_tmp / "run" / "control.sock"
    out = short_tmp / "out"
    daemon = start_daemon(config, "--until-idle")
    try:
        wait_until(control.exists, timeout=30, message="control socket")
        for victim, after in (("processor_default_0", 800), ("producer_0", 1800)):
            wait_until(lambda a=after: len(read_records(str(out), "batch-")) >= a,
                       timeout=90, message=f"{after} handled before killing {victim}")
            os.kill(stage_pids(control)[victim], signal.SIGKILL)
        code = daemon.wait(180)
    except subprocess.TimeoutExpired:
        status = subprocess.run(offbroadway_cmd("status", "--json", "--socket", str(control)),
                                cwd=REPO, env=test_env(), capture_output=True, text=True,
                                timeout=30).stdout
        daemon.kill()
        pytest.fail(f"not idle after 180 s; status {status[-4000:]}; log "
                    f"{daemon.communicate(timeout=30)[1][-4000:]}")
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(30)
    err = daemon.stderr.read() if daemon.stderr else ""
    assert code == 3, err[-3000:]   # 3: finished, the 97 failing rows failed
    handled = Counter(r["id"] for r in read_records(str(out), "batch-"))
    failed = {r["id"] for r in read_records(str(out), "failed-")}
    everything = {f"jobs:{i}" for i in range(1, n + 1)}
    assert set(handled) == everything - expected_failed, "a row was lost"
    assert failed == expected_failed
    assert len(handled) < n, "the kills came after the end: nothing was tested"
    con = sqlite3.connect(db)
    left = con.execute("SELECT count(*) FROM jobs").fetchone()[0]
    dead = {f"jobs:{i}" for (i,) in con.execute("SELECT id FROM jobs_dead")}
    con.close()
    assert left == 0, f"{left} rows never acked"
    assert dead == expected_failed
    print(f"custom source: {sum(handled.values()) - len(handled)} rows handled twice "
          f"(in flight at a kill)")
