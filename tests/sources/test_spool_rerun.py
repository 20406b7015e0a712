"""The README's main job run again once its spool is read: ``run --until-idle`` says the
files were moved to ``done/`` and starts nothing, not even the Spark server (half a minute
to write no rows), with the example config as shipped (metrics port aside)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from tests.conftest import REPO, free_port, offbroadway_cmd, test_env


def test_rerun_on_a_read_spool_says_where_the_files_went_and_starts_nothing(
        short_tmp: Path) -> None:
    done = short_tmp / "var" / "spool" / "done"
    done.mkdir(parents=True)
    for f in (REPO / "examples" / "spool").glob("*.jsonl"):
        shutil.copy(f, done / f.name)      # what the first run left behind
    config = short_tmp / "example.toml"
    config.write_text((REPO / "config" / "example.toml").read_text().replace(
        '"127.0.0.1:9464"', f'"127.0.0.1:{free_port()}"'))
    started = time.monotonic()
    proc = subprocess.run(offbroadway_cmd("run", str(config), "--until-idle"), cwd=short_tmp,
                          env=test_env(), capture_output=True, text=True, timeout=180)
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = len(list(done.iterdir()))
    assert (f"orders: nothing to read: no file matching '*.jsonl' in "
            f"{short_tmp / 'var' / 'spool'}; the {files} file(s) read before were moved to "
            f"{done}") in proc.stdout, proc.stdout
    assert "spark" not in proc.stderr.lower(), proc.stderr[-3000:]   # no Spark server
    assert not (short_tmp / "var" / "orders").exists()              # no dataset touched
    assert not (short_tmp / "var" / "run").exists()                 # nothing started
    assert took < 15, took
