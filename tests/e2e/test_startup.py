"""What keeps a daemon from starting says so in one line and leaves nothing behind: a
second daemon on a runtime dir another one owns, a metrics port in use; and under
journald (``$JOURNAL_STREAM`` naming stderr) lines carry the syslog priority and no
timestamp of their own."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from tests.conftest import REPO, offbroadway_cmd, test_env, wait_until
from tests.e2e.test_operations import free_port, status
from tests.e2e.test_pipeline import make_config, stage_pids, write_spool


def with_metrics(config: Path, port: int) -> None:
    config.write_text(config.read_text().replace('listen = ""', f'listen = "127.0.0.1:{port}"'))


def test_a_second_daemon_on_the_same_runtime_dir_exits_and_touches_nothing(
        short_tmp: Path) -> None:
    write_spool(short_tmp / "spool", 10, files=1)
    config = make_config(short_tmp, batchers={"even": {"batch_size": 10}})
    with_metrics(config, free_port())
    sock = short_tmp / "run" / "control.sock"
    first = subprocess.Popen(offbroadway_cmd("run", str(config)), cwd=REPO, env=test_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: sock.exists() and len(stage_pids(sock)) == 5, timeout=60,
                   message="the first daemon's five stages up")
        pids = stage_pids(sock)
        run_dir = short_tmp / "run"
        before = {p: p.stat().st_ino for p in run_dir.rglob("*")}
        second = subprocess.run(offbroadway_cmd("run", str(config)), cwd=REPO,
                                env=test_env(), capture_output=True, text=True, timeout=60)
        assert second.returncode == 1
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert f"another offbroadway daemon (pid {first.pid}) is running on" in lines[0]
        # nothing removed or replaced (the first daemon's stages may add metric files)
        assert {p: p.stat().st_ino for p in before if p.exists()} == before
        assert stage_pids(sock) == pids           # the first still answers, unchanged
        assert status(sock)["pipeline"] == "e2e"
    finally:
        first.terminate()
        assert first.wait(60) == 0
    # the lock went with its holder: the next daemon starts
    assert not (short_tmp / "run" / "daemon.lock").exists()


def test_metrics_port_in_use_is_one_line_and_leaves_nothing_behind(short_tmp: Path) -> None:
    write_spool(short_tmp / "spool", 10, files=1)
    config = make_config(short_tmp, batchers={"even": {"batch_size": 10}})
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with_metrics(config, port)
        out = subprocess.run(offbroadway_cmd("run", str(config)), cwd=REPO, env=test_env(),
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert f"metrics.listen = '127.0.0.1:{port}'" in lines[0]
    assert "Address already in use" in lines[0]
    assert list((short_tmp / "run").iterdir()) == []   # no hub.sock, no lock, no metrics


def test_under_journald_lines_carry_the_priority_and_no_timestamp(short_tmp: Path) -> None:
    write_spool(short_tmp / "spool", 10, files=1)
    config = make_config(short_tmp, batchers={"even": {"batch_size": 10}})
    # a warning from `check` (a setting with a costly consequence) and from the daemon
    config.write_text(config.read_text().replace("[pipeline]\n",
                                                 "[pipeline]\nmax_restarts = 1\n"))
    log = short_tmp / "stderr.log"
    with open(log, "w") as err:
        st = os.fstat(err.fileno())
        env = {**test_env(), "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        code = subprocess.run(offbroadway_cmd("run", str(config), "--until-idle"), cwd=REPO,
                              env=env, stdout=subprocess.DEVNULL, stderr=err,
                              timeout=120).returncode
    assert code == 3, log.read_text()   # 3: finished, the odd lines failed (no batcher "odd")
    lines = log.read_text().splitlines()
    assert lines and all(line.startswith(("<3>", "<4>", "<6>", "<7>")) for line in lines), lines
    assert any(line.startswith("<4>offbroadway: warning: ") for line in lines), lines
    assert any(line.startswith("<6>INFO [daemon] ") for line in lines), lines
    assert any(line.startswith("<6>INFO [producer_0] ") for line in lines), lines   # a stage
    # not the journal (stderr is another file than $JOURNAL_STREAM names): plain lines
    with open(log, "w") as err:
        subprocess.run(offbroadway_cmd("check", str(config)), cwd=REPO,
                       env={**test_env(), "JOURNAL_STREAM": "1:1"}, stdout=subprocess.DEVNULL,
                       stderr=err, timeout=60)
    assert log.read_text().startswith("offbroadway: warning: "), log.read_text()
