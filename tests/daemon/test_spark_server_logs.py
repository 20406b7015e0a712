"""The Spark server's own lines speak the pipeline's log format (issue 17): with
``log_format = "json"`` each is one JSON object (a traceback inside it, under ``exc``), in
text mode the same ``time LEVEL [child] logger: message`` as every stage.  No JVM is
started: the wrapper's lines before it are the ones at stake."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from offbroadway.stages.runtime import logs

from tests.conftest import REPO, test_env


def run_server(env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = test_env()
    for key in list(env):
        if key.startswith("OFFBROADWAY_SPARK_"):
            del env[key]
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "offbroadway.daemon.spark.server"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=60)


def test_json_lines_and_a_traceback_as_json(tmp_path: Path) -> None:
    # missing settings: an error line
    res = run_server({logs.FORMAT_ENV: "json"})
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    record = json.loads(lines[0])
    assert record["level"] == "error" and record["child"] == "spark"
    assert "missing environment" in record["msg"]

    # an unexpected exception (a symlink loop under the state dir): one JSON record whose
    # "exc" carries the traceback, not a bare Python traceback on stderr
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    res = run_server({logs.FORMAT_ENV: "json", "OFFBROADWAY_SPARK_PORT": "0",
                      "OFFBROADWAY_SPARK_TOKEN": "t" * 20,
                      "OFFBROADWAY_SPARK_DIR": str(tmp_path / "a" / "spark")})
    assert res.returncode == 1
    records = [json.loads(ln) for ln in res.stderr.strip().splitlines()]
    assert len(records) == 1, res.stderr
    assert records[0]["level"] == "error" and "Traceback" in records[0]["exc"]
    assert "t" * 20 not in res.stderr


def test_text_lines_in_the_pipelines_format() -> None:
    res = run_server({logs.FORMAT_ENV: "text"})
    line = res.stderr.strip()
    assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ERROR \[spark\] "
                    r"offbroadway\.spark_server: missing environment", line), line
