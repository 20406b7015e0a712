"""Crash loops: supervisors escalate within their intensity and the daemon exits non-zero
with a line naming the child and why, having acked nothing it did not write."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import REPO, offbroadway_cmd, test_env
from tests.e2e.handlers import read_records
from tests.e2e.test_pipeline import make_config, write_spool


def run(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run(offbroadway_cmd("run", str(config), "--until-idle"), cwd=REPO,
                          env=test_env(), capture_output=True, text=True, timeout=120)


def test_a_handler_that_kills_its_process_escalates_to_a_nonzero_exit(short_tmp: Path) -> None:
    write_spool(short_tmp / "spool", 50, files=1)
    config = make_config(short_tmp, handler="tests.e2e.handlers:CrashesProcess",
                         batchers={"default": {"batch_size": 10, "batch_timeout": 0.2}})
    proc = run(config)
    assert proc.returncode == 1, proc.stderr[-3000:]
    # the root supervisor gave up, and the log says which child died and how
    assert "PipelineSupervisor gave up" in proc.stderr, proc.stderr[-3000:]
    assert "processor_default_" in proc.stderr and "code 3" in proc.stderr
    # nothing was written, so nothing was acked: every line is still in the spool
    assert read_records(str(short_tmp / "out"), "batch-") == []
    assert len((short_tmp / "spool" / "part-000.jsonl").read_text().splitlines()) == 50
    assert not (short_tmp / "spool" / "done").exists()


def test_a_stage_that_cannot_start_fails_the_start(short_tmp: Path) -> None:
    write_spool(short_tmp / "spool", 5, files=1)
    config = make_config(short_tmp, handler="tests.e2e.handlers:CrashesAtStart")
    proc = run(config)
    assert proc.returncode == 1
    assert "failed to start" in proc.stderr and "processor_default_0" in proc.stderr
