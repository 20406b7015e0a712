"""Log lines at the level a reader expects: a designed escalation (a batch processor's
supervisor allows no restart and hands every crash to its parent) is a WARNING that says
cascade, not an ERROR (``journalctl -p err`` is for the pipeline that cannot go on); a
value that cannot cross stages fails its messages with one aggregate line per reason, as a
raising handler's failures do, not a line per message."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.conftest import REPO, offbroadway_cmd, test_env, wait_until
from tests.e2e.handlers import read_records
from tests.e2e.test_contract import HANDLER, _node, _spool, _status
from tests.e2e.test_pipeline import make_config, run_until_idle


def test_a_killed_batch_processor_is_a_cascade_not_an_error(short_tmp: Path) -> None:
    n = 200
    _spool(short_tmp, [{"seq": i} for i in range(n)])
    config = make_config(short_tmp, handler=HANDLER, context={"batch_slow": 0.2},
                         batchers={"default": {"batch_size": 20, "batch_timeout": 0.1}})
    sock = short_tmp / "run" / "control.sock"
    daemon = subprocess.Popen(offbroadway_cmd("run", str(config), "--until-idle"), cwd=REPO,
                              env=test_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        wait_until(lambda: len(read_records(str(short_tmp / "out"), "batch-")) >= 20,
                   timeout=60, message="a first batch written")
        victim = _node(_status(sock)["tree"], "batch_processor_default_0")
        os.kill(victim["pid"], signal.SIGKILL)
        _, err = daemon.communicate(timeout=120)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert daemon.returncode == 0, err[-3000:]
    gave_up = [ln for ln in err.splitlines()
               if "supervisor BatchProcessorSupervisor_default gave up" in ln]
    assert gave_up and all(" WARNING " in ln and "cascade" in ln for ln in gave_up), gave_up
    errors = [ln for ln in err.splitlines() if " ERROR " in ln]
    assert not errors, errors


def test_values_that_cannot_cross_stages_make_one_line_per_reason(short_tmp: Path) -> None:
    n = 40
    _spool(short_tmp, [{"seq": i, "bad": True} for i in range(n)])
    config = make_config(short_tmp, handler="tests.e2e.value_handlers:Values",
                         batchers={"default": {"batch_size": 10, "batch_timeout": 0.1}})
    proc = run_until_idle(config)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert len(read_records(str(short_tmp / "out"), "failed-")) == n
    lines = [ln for ln in proc.stderr.splitlines() if "is a set" in ln]
    # one aggregate line per processor (each logs what it failed), never one per message
    assert 1 <= len(lines) <= 2, lines
    assert sum(int(ln.split(" messages failed")[0].rsplit(" ", 1)[1]) for ln in lines) == n
