"""The daemon as a systemd service and a Prometheus target: sd_notify over a fake
``$NOTIFY_SOCKET``, metrics that parse and add up, an operator restart under one_for_all,
`top` in a real terminal (tmux), and the unit file accepted by ``systemd-analyze verify``."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from collections import Counter
from pathlib import Path

import psutil
import pytest
from offbroadway.supervision.tree import snapshot_nodes
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO, offbroadway_cmd, test_env, wait_until
from tests.e2e.handlers import read_records
from tests.e2e.test_operations import cli, free_port, status
from tests.e2e.test_pipeline import make_config, stage_pids, write_spool


def test_sd_notify_ready_watchdog_stopping_and_metrics_that_add_up(short_tmp: Path) -> None:
    n = 3000
    write_spool(short_tmp / "spool", n, files=2)
    port = free_port()
    config = make_config(short_tmp, batchers={"even": {"batch_size": 100, "batch_timeout": 0.2},
                                              "odd": {"batch_size": 100, "batch_timeout": 0.2}})
    config.write_text(config.read_text().replace('listen = ""', f'listen = "127.0.0.1:{port}"'))
    notify_path = short_tmp / "notify.sock"
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.settimeout(0.2)
    env = {**test_env(), "NOTIFY_SOCKET": str(notify_path), "WATCHDOG_USEC": "1000000"}
    sock = short_tmp / "run" / "control.sock"
    daemon = subprocess.Popen(offbroadway_cmd("run", str(config)), cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    messages: list[str] = []
    ready_tree: dict | None = None

    def receive() -> list[str]:
        try:
            messages.extend(notify.recv(4096).decode().splitlines())
        except TimeoutError:
            pass
        return messages

    try:
        wait_until(lambda: "READY=1" in receive(), timeout=60, message="READY=1")
        ready_tree = status(sock)           # READY=1 only once every child is up
        assert all(node["state"] == "running" for node in snapshot_nodes(ready_tree["tree"])
                   if node["kind"] == "worker" and node["id"] != "terminator")
        wait_until(lambda: receive().count("WATCHDOG=1") >= 2, timeout=10,
                   message="periodic WATCHDOG=1")

        # every line acked; /metrics parses and its counters say the same
        def acked() -> float:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                          timeout=10).read().decode()
            total = 0.0
            for family in text_string_to_metric_families(text):
                if family.name == "offbroadway_messages_acked":
                    total += sum(s.value for s in family.samples if s.name.endswith("_total")
                                 and s.labels["role"] == "producer")
            return total

        wait_until(lambda: acked() == n, timeout=60, message=f"{n} acked in /metrics")
        assert cli("stop", "--socket", str(sock)).returncode == 0
        assert daemon.wait(60) == 0
        receive()
        while True:                          # what was sent before the exit
            before = len(messages)
            receive()
            if len(messages) == before:
                break
    finally:
        if daemon.poll() is None:
            daemon.kill()
        notify.close()
    assert "STOPPING=1" in messages
    assert any(m.startswith("STATUS=") for m in messages)
    # the whole stop budget, announced once (drain + every stage's grace; see stopbudget)
    from offbroadway.daemon.config.load import load_config
    from offbroadway.daemon.spark.wiring import stop_budget

    budget = stop_budget(load_config(str(config)).config)
    assert budget > 20 + 10                      # shutdown_timeout and more
    extends = [m for m in messages if m.startswith("EXTEND_TIMEOUT_USEC=")]
    assert extends == [f"EXTEND_TIMEOUT_USEC={int(budget * 1_000_000)}"], extends


def test_operator_restart_of_a_processor_restarts_its_one_for_all_siblings(
        short_tmp: Path) -> None:
    n = 6000
    write_spool(short_tmp / "spool", n, files=2)
    config = make_config(short_tmp, context={"slow": 0.001}, batchers={
        "even": {"batch_size": 100, "batch_timeout": 0.3},
        "odd": {"batch_size": 100, "batch_timeout": 0.3}})
    sock = short_tmp / "run" / "control.sock"
    log = short_tmp / "daemon.log"
    with open(log, "w") as err:     # a file, not a pipe nobody reads while it runs
        daemon = subprocess.Popen(offbroadway_cmd("run", str(config), "--until-idle"),
                                  cwd=REPO, env=test_env(), stdout=subprocess.DEVNULL,
                                  stderr=err)
    try:
        wait_until(lambda: len(read_records(str(short_tmp / "out"), "batch-")) >= 500,
                   timeout=60, message="messages to flow")
        before = stage_pids(sock)
        for pid in before.values():          # status reports the real processes
            assert "offbroadway.stages.worker" in " ".join(psutil.Process(pid).cmdline())
        assert cli("restart", "processor_default_0", "--socket", str(sock)).returncode == 0
        after = wait_until(lambda: (p := stage_pids(sock)) and all(
            p.get(k) not in (None, before[k]) for k in ("processor_default_0",
                                                        "processor_default_1")) and p,
            timeout=30, message="both processors restarted (one_for_all)")
        # the rest_for_one pipeline supervisor does not restart what comes before
        assert after["producer_0"] == before["producer_0"]
        code = daemon.wait(120)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            print(log.read_text()[-5000:])
    assert code == 0, log.read_text()[-3000:]
    handled = Counter(r["id"] for r in read_records(str(short_tmp / "out"), "batch-"))
    assert len(handled) == n, f"{n - len(handled)} lost across the restart"
    assert not list((short_tmp / "spool").glob("*.jsonl"))


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_top_shows_the_tree_in_a_terminal(short_tmp: Path) -> None:
    write_spool(short_tmp / "spool", 100_000, files=1)
    config = make_config(short_tmp, context={"slow": 0.001},
                         batchers={"even": {"batch_size": 100}, "odd": {"batch_size": 100}})
    sock = short_tmp / "run" / "control.sock"
    daemon = subprocess.Popen(offbroadway_cmd("run", str(config)), cwd=REPO, env=test_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    session = f"obtop{os.getpid()}"
    try:
        wait_until(sock.exists, timeout=30, message="the daemon up")
        top = " ".join([sys.executable, "-m", "offbroadway.daemon.cli", "top", "--socket",
                        str(sock)])
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "40",
                        f"cd {REPO} && PYTHONPATH={REPO} {top}"], check=True)

        def pane() -> str:
            return subprocess.run(["tmux", "capture-pane", "-p", "-t", session],
                                  capture_output=True, text=True).stdout

        screen = wait_until(lambda: "out/s" in (p := pane()) and "producer_0" in p and p,
                            timeout=30, message="top to draw the tree")
        for wid in ("PipelineSupervisor (rest_for_one)", "processor_default_1",
                    "batch_processor_even_0", "terminator"):
            assert wid in screen
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        daemon.terminate()
        daemon.wait(60)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed")
def test_the_unit_passes_systemd_analyze_verify(short_tmp: Path) -> None:
    unit = (REPO / "systemd" / "offbroadway@.service").read_text()
    exe = shutil.which("offbroadway") or str(Path(sys.executable).parent / "offbroadway")
    unit = unit.replace("/opt/offbroadway/bin/offbroadway", exe)
    path = short_tmp / "offbroadway@orders.service"
    path.write_text(unit)
    out = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr
