"""The operator's commands behave like the ones operators know (issue 17): failures are
counted and logged, ``status`` shows uptime and books and survives a pipe and a daemon
going away, ``stop`` waits, ``restart``/``resume`` say what is wrong, ``--help`` and
``--version`` exist, and a clean exit leaves no socket behind."""

from __future__ import annotations

import json
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from offbroadway.daemon.core.outcome import EXIT_FAILED
from offbroadway.supervision.tree import snapshot_find, snapshot_nodes

from tests.conftest import REPO, offbroadway_cmd, test_env, wait_until
from tests.e2e.test_pipeline import make_config, write_spool


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(offbroadway_cmd(*args), cwd=REPO, env=test_env(), capture_output=True,
                          text=True, timeout=timeout)


def start(config: Path, log: Path) -> subprocess.Popen:
    """The daemon with its log in a file (read while it runs, never a full pipe)."""
    with open(log, "w") as f:
        return subprocess.Popen(offbroadway_cmd("run", str(config)), cwd=REPO, env=test_env(),
                                stdout=f, stderr=subprocess.STDOUT, text=True)


def status(sock: Path) -> dict:
    out = cli("status", "--json", "--socket", str(sock))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_unknown_batcher_is_a_warning_and_a_failed_count_in_status(short_tmp: Path) -> None:
    """A handler routing to a batcher the config lacks: every message fails; the daemon
    says so in a WARNING with the count and the reason, and ``status`` counts them."""
    config = make_config(short_tmp, handler="tests.daemon.bad_handlers:UnknownBatcher",
                         source="generator", options={"payload_bytes": 10},
                         batchers={"b": {"batch_size": 10, "batch_timeout": 0.2}})
    log = short_tmp / "daemon.log"
    sock = short_tmp / "run" / "control.sock"
    daemon = start(config, log)
    try:
        s = wait_until(lambda: sock.exists() and (st := status(sock))["failed"] > 0 and st,
                       timeout=60, message="failed messages in status")
        assert s["failed"] > 0 and s["acked"] == 0
        assert s["failed_to"].startswith("dropped")
        warning = wait_until(lambda: [ln for ln in log.read_text().splitlines()
                                      if " WARNING " in ln and "messages failed" in ln],
                             timeout=30, message="the failure WARNING")
        assert re.search(r"processor_default_\d: \d+ messages failed .*\d+ x unknown batcher "
                         r"'nosuch'", warning[0]), warning[0]
        text = cli("status", "--socket", str(sock)).stdout
        assert re.search(r"^pipeline e2e  up \d+s  acked 0  failed \d+", text, re.M), text
        assert "failed messages: dropped" in text
        # the WARNING is rate-limited: an endless stream of failures is a few lines
        # (one per stage per 10 s), not one per message
        n_failed = status(sock)["failed"]
        lines = [ln for ln in log.read_text().splitlines() if "messages failed" in ln]
        assert n_failed > 1000 and len(lines) <= 2 * 2 * 7, (n_failed, len(lines))
        assert cli("stop", "--socket", str(sock)).returncode == 0
        assert daemon.wait(30) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


def test_operator_commands(short_tmp: Path) -> None:
    write_spool(short_tmp / "spool", 3000, files=2)
    config = make_config(short_tmp, context={"slow": 0.001},
                         batchers={"even": {"batch_size": 100, "batch_timeout": 0.5},
                                   "odd": {"batch_size": 100, "batch_timeout": 0.5}})
    log = short_tmp / "daemon.log"
    sock = short_tmp / "run" / "control.sock"
    daemon = start(config, log)
    try:
        s = wait_until(lambda: sock.exists() and (st := status(sock)) and all(
            n["state"] == "running" for n in snapshot_nodes(st["tree"])) and st, timeout=60,
            message="every child running")
        for key in ("paused", "draining", "uptime", "failed", "acked", "stopping"):
            assert key in s, key
        assert s["paused"] is False and s["draining"] is False and s["uptime"] > 0

        # the producer never reports more out than in
        def producer() -> dict:
            return snapshot_find(status(sock)["tree"], "producer_0")
        wait_until(lambda: producer().get("messages", {}).get("in", 0) > 0, timeout=30,
                   message="messages in")
        for _ in range(5):
            m = producer()["messages"]
            assert m["out"] <= m["in"], m

        # status into a pipe that closes early: no BrokenPipeError
        piped = subprocess.run(
            f"{sys.executable} -m offbroadway.daemon.cli status --socket {sock} | head -1",
            shell=True, cwd=REPO, env=test_env(), capture_output=True, text=True, timeout=60)
        assert piped.stdout.startswith("pipeline e2e"), piped.stdout
        assert "Traceback" not in piped.stderr and "BrokenPipe" not in piped.stderr

        # restart of an unknown id lists the valid ones
        bad = cli("restart", "nosuch", "--socket", str(sock))
        assert bad.returncode == 1
        assert "nosuch" in bad.stderr and "producer_0" in bad.stderr \
            and "batcher_even" in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1

        # resume with nothing drained says so; drain and resume are logged
        res = cli("resume", "--socket", str(sock))
        assert res.returncode == 0 and "nothing to resume" in res.stdout
        assert cli("drain", "--socket", str(sock)).returncode == 0
        assert status(sock)["paused"] is True
        assert cli("resume", "--socket", str(sock)).returncode == 0
        wait_until(lambda: "drain requested" in log.read_text()
                   and "resume requested" in log.read_text(), timeout=10,
                   message="drain and resume in the log")

        # stop waits until the daemon has exited
        stop = cli("stop", "--socket", str(sock))
        assert stop.returncode == 0, stop.stderr
        assert "has exited" in stop.stdout
        assert daemon.wait(5) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    # a clean exit leaves no socket behind
    left = [p.name for p in (short_tmp / "run").iterdir() if p.is_socket()]
    assert left == [], left


def test_stop_no_wait_returns_at_once(short_tmp: Path) -> None:
    write_spool(short_tmp / "spool", 10, files=1)
    config = make_config(short_tmp)
    log = short_tmp / "daemon.log"
    sock = short_tmp / "run" / "control.sock"
    daemon = start(config, log)
    try:
        wait_until(lambda: sock.exists() and status(sock), timeout=60, message="the daemon")
        out = cli("stop", "--no-wait", "--socket", str(sock))
        assert out.returncode == 0 and "requested" in out.stdout
        assert daemon.wait(30) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


def test_status_when_the_daemon_hangs_up(short_tmp: Path) -> None:
    """A daemon shutting down may accept and close without answering: one line, exit 1."""
    path = short_tmp / "control.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)

    def hang_up() -> None:
        for _ in range(2):
            conn, _ = server.accept()
            conn.recv(100)
            # RST instead of FIN: what the client sees when the daemon's loop is torn down
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    t = threading.Thread(target=hang_up, daemon=True)
    t.start()
    try:
        for args in (("status",), ("status", "--json")):
            out = cli(*args, "--socket", str(path))
            assert out.returncode == 1
            assert "Traceback" not in out.stderr, out.stderr
            assert len(out.stderr.strip().splitlines()) == 1, out.stderr
            assert "closed the connection" in out.stderr
    finally:
        server.close()


def test_help_and_version() -> None:
    version = cli("--version")
    assert version.returncode == 0 and re.match(r"offbroadway \d+\.\d+", version.stdout)
    top = cli("--help").stdout
    assert "``" not in top
    for verb, words in (("run", ("CONFIG", "pipeline's TOML config")),
                        ("check", ("CONFIG",)),
                        ("restart", ("CHILD_ID", "as `status` shows it")),
                        ("status", ("--json", "JSON object")),
                        ("top", ("--interval", "seconds between refreshes")),
                        ("stop", ("--no-wait",))):
        text = cli(verb, "--help").stdout
        assert "``" not in text, verb
        for w in words:
            assert w in text, (verb, w)


def test_second_ctrl_c_explains_and_third_stops_at_once(short_tmp: Path) -> None:
    """Ctrl-C drains; a second one is not silently ignored; a third stops without waiting
    for the drain (shutdown_timeout here is far longer than the test may take)."""
    import signal

    # each processor holds up to max_demand (10) messages of 2 s each: a drain takes ~20 s
    write_spool(short_tmp / "spool", 200, files=1)
    config = make_config(short_tmp, context={"slow": 2.0}, shutdown_timeout=300.0)
    log = short_tmp / "daemon.log"
    sock = short_tmp / "run" / "control.sock"
    daemon = start(config, log)
    try:
        wait_until(lambda: sock.exists() and (s := status(sock)) and all(
            n["state"] == "running" for n in snapshot_nodes(s["tree"])), timeout=60,
            message="every child running")
        daemon.send_signal(signal.SIGINT)
        wait_until(lambda: "SIGINT received: draining" in log.read_text(), timeout=10,
                   message="the drain to begin")
        daemon.send_signal(signal.SIGINT)
        wait_until(lambda: "received again: already stopping" in log.read_text(), timeout=10,
                   message="the second Ctrl-C to be answered")
        assert daemon.poll() is None            # still draining: the slow batches take long
        daemon.send_signal(signal.SIGINT)
        started = time.monotonic()
        assert daemon.wait(60) == 0
        # not the drain's ~20 s: the stages are stopped at once (a busy one is SIGKILLed
        # after its 5 s shutdown), what they held stays unacked at the source
        assert time.monotonic() - started < 15
        text = log.read_text()
        assert "received a third time: stopping now" in text
        assert "Traceback" not in text
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


def test_the_summary_says_where_failed_messages_went(short_tmp: Path) -> None:
    write_spool(short_tmp / "spool", 20, files=1, bad_lines=(3, 7))
    config = make_config(short_tmp, batchers={"even": {"batch_size": 10, "batch_timeout": 0.2},
                                              "odd": {"batch_size": 10, "batch_timeout": 0.2}})
    proc = subprocess.run(offbroadway_cmd("run", str(config), "--until-idle"), cwd=REPO,
                          env=test_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]   # finished, some failed
    dead = short_tmp / "state" / "spool" / "dead-letter.jsonl"
    assert f"18 messages acked, 2 failed (failed messages: {dead})" in proc.stdout, proc.stdout
    assert len(dead.read_text().splitlines()) == 2
    # and the stage that failed them said so, once, with the count and the reason
    warnings = [ln for ln in proc.stderr.splitlines() if "messages failed" in ln]
    assert len(warnings) >= 1 and all(" WARNING " in w for w in warnings)
    assert sum(int(re.search(r": (\d+) messages failed", w).group(1)) for w in warnings) == 2
