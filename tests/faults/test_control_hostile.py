"""Hostile clients on the control socket: one that connects and sends nothing, one that
sends garbage, one that opens hundreds of connections.  Each is answered with one error
line when it can be and dropped; meanwhile ``status`` answers at once and the pipeline
keeps flowing; the daemon's file descriptors come back to where they were; the log has
one line about it, not one per client, and no traceback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
from offbroadway.daemon.cli import control
from offbroadway.daemon.shell import control_server
from offbroadway.supervision.tree import snapshot_find

from tests.conftest import test_env, wait_until

HANDLER = '''
from offbroadway import Pipeline

class Noop(Pipeline):
    def handle_message(self, processor, message, context):
        return message
'''


def start(tmp: Path, listen: str = "") -> tuple[subprocess.Popen, str]:
    (tmp / "noop_ctl.py").write_text(HANDLER)
    config = tmp / "p.toml"
    config.write_text(f"""
[pipeline]
name = "hostile"
handler = "noop_ctl:Noop"

[producer]
source = "generator"
rate_limit = {{ allowed_messages = 200, interval = 0.1 }}

[processors.default]
concurrency = 1

[metrics]
listen = "{listen}"

[runtime]
dir = "{tmp / 'run'}"
state_dir = "{tmp / 'state'}"
""")
    env = test_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp), env["PYTHONPATH"]])
    log = open(tmp / "daemon.log", "w")
    daemon = subprocess.Popen([sys.executable, "-m", "offbroadway.daemon.cli", "run",
                               str(config)], cwd=tmp, env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    log.close()
    sock = str(tmp / "run" / "control.sock")
    try:
        wait_until(lambda: acked(sock) > 0, timeout=60, interval=0.2, message="messages acked")
    except BaseException:       # not up: the test fails here, and leaves no daemon behind
        daemon.kill()
        daemon.wait(30)
        raise
    return daemon, sock


def acked(sock: str) -> int:
    try:
        return int(control.request(sock, {"cmd": "status"}, timeout=5)["status"]["acked"])
    except (control.ControlError, KeyError):
        return 0


def connect(sock: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock)
    return s


def answer(s: socket.socket, timeout: float) -> bytes:
    """What the daemon sends before it closes the connection (b'' if nothing)."""
    s.settimeout(timeout)
    chunks = []
    while True:
        data = s.recv(65536)
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def test_silent_garbage_and_flooding_clients_hold_nothing_up(short_tmp: Path) -> None:
    daemon, sock = start(short_tmp)
    proc = psutil.Process(daemon.pid)
    try:
        fds_before = proc.num_fds()
        silent = [connect(sock) for _ in range(200)]       # 136 of them get evicted
        partial = connect(sock)
        partial.sendall(b'{"cmd": "sta')                    # and then nothing
        garbage = {
            b"\xff\xfe\x00 not utf-8\n": b"bad request",
            b"[1, 2, 3]\n": b"not a JSON object",
            b"{not json\n": b"bad request",
            os.urandom(100_000).replace(b"\n", b"x"): b"longer than",
        }
        sent = []
        for payload, expect in garbage.items():
            s = connect(sock)
            s.sendall(payload)
            sent.append((s, expect))

        # meanwhile: status answers at once, every time, and the pipeline flows
        first = acked(sock)
        worst = 0.0
        for _ in range(20):
            t0 = time.monotonic()
            reply = control.request(sock, {"cmd": "status"}, timeout=5)
            worst = max(worst, time.monotonic() - t0)
            assert reply["ok"], reply
        # the connections before it in the kernel's queue are accepted at ACCEPT_RATE
        bound = len(silent) / control_server.ACCEPT_RATE + 2.0
        assert worst < bound, f"a status call took {worst:.2f}s among hostile clients"
        wait_until(lambda: acked(sock) > first + 200, timeout=10,
                   message="the pipeline flowing among hostile clients")

        for s, expect in sent:                              # garbage: one error line
            got = answer(s, 5)
            assert expect in got and b'"ok": false' in got, (expect, got[:200])
            s.close()
        # the silent ones: the evicted closed at once, the rest answered at READ_TIMEOUT
        t0 = time.monotonic()
        answers = [answer(s, control_server.READ_TIMEOUT + 10) for s in [*silent, partial]]
        waited = time.monotonic() - t0
        assert waited < control_server.READ_TIMEOUT + 5, waited
        timed_out = [a for a in answers if b"no request within" in a]
        evicted = [a for a in answers if a == b""]
        assert len(timed_out) + len(evicted) == len(answers), answers[:3]
        assert len(timed_out) <= control_server.MAX_WAITING, len(timed_out)
        assert b"no request within" in answers[-1]        # the partial line: timed out
        for s in silent:
            s.close()
        partial.close()
        wait_until(lambda: proc.num_fds() <= fds_before + 2, timeout=10,
                   message=f"the daemon's fds back to {fds_before} (now {proc.num_fds()})")
        assert acked(sock) > first
        os.kill(daemon.pid, signal.SIGTERM)
        assert daemon.wait(60) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(30)
    text = (short_tmp / "daemon.log").read_text()
    assert "Traceback" not in text, text[-3000:]
    lines = [ln for ln in text.splitlines() if "control socket" in ln]
    assert 1 <= len(lines) <= 2, lines      # one line a minute, not one per client



def test_a_status_flood_is_answered_from_one_status_per_fifth_of_a_second(short_tmp: Path
                                                                         ) -> None:
    """A status costs the daemon ~2 ms of CPU (tree, board, psutil, JSON): 1,000 a second
    would take a core from the loop that runs the hub and the supervisors.  Requests within
    SHARED_FOR share one answer (its ``uptime`` says when it was computed); any other verb
    drops it, so the status after a restart shows the restart."""
    daemon, sock = start(short_tmp)
    try:
        t0 = time.monotonic()
        uptimes = [control.request(sock, {"cmd": "status"}, timeout=5)["status"]["uptime"]
                   for _ in range(300)]
        elapsed = time.monotonic() - t0
        computed = len(set(uptimes))
        assert computed <= elapsed / control_server.SHARED_FOR + 2, (computed, elapsed)
        before = control.request(sock, {"cmd": "status"}, timeout=5)["status"]
        assert control.request(sock, {"cmd": "restart", "child": "producer_0"},
                               timeout=60)["ok"]
        after = control.request(sock, {"cmd": "status"}, timeout=5)["status"]
        assert after["uptime"] != before["uptime"]

        def restarts(s: dict) -> int:
            node = snapshot_find(s["tree"], "producer_0")
            if node is None:
                raise AssertionError("no producer_0")
            return node["restarts"]
        assert restarts(after) == restarts(before) + 1
        os.kill(daemon.pid, signal.SIGTERM)
        assert daemon.wait(60) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(30)


def test_connections_are_accepted_at_a_bounded_rate(short_tmp: Path) -> None:
    """Each connection costs the daemon a few tenths of a millisecond of CPU whatever its
    answer (most of it the wake-up): beyond
    ACCEPT_RATE a second (after a burst) they wait in the kernel's queue, so 300 calls in
    a row take at least (300 - burst) / rate seconds, and every one is answered."""
    daemon, sock = start(short_tmp)
    try:
        time.sleep(1.0)                   # the burst allowance refilled
        n = 300
        t0 = time.monotonic()
        for _ in range(n):
            assert control.request(sock, {"cmd": "status"}, timeout=10)["ok"]
        elapsed = time.monotonic() - t0
        least = (n - control_server.ACCEPT_BURST) / control_server.ACCEPT_RATE
        assert elapsed >= least * 0.95, (elapsed, least)
        os.kill(daemon.pid, signal.SIGTERM)
        assert daemon.wait(60) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(30)


def test_scrapes_close_together_share_one_answer(short_tmp: Path) -> None:
    """A scrape costs the daemon ~8 ms of CPU: scrapes within SCRAPE_SHARED_FOR get the
    same answer (byte for byte, the per-child CPU seconds included), so a scraper every
    100 ms costs one answer per half second."""
    from offbroadway.daemon.observe import metrics

    from tests.conftest import free_port

    port = free_port()
    daemon, _ = start(short_tmp, f"127.0.0.1:{port}")
    try:
        t0 = time.monotonic()
        bodies = []
        while time.monotonic() - t0 < 3.0:
            bodies.append(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                                 timeout=10).read())
        elapsed = time.monotonic() - t0
        assert len(bodies) >= 20, len(bodies)
        assert len(set(bodies)) <= elapsed / metrics.SCRAPE_SHARED_FOR + 2, \
            (len(set(bodies)), elapsed)
        assert len(set(bodies)) >= 2        # and it does move on
        os.kill(daemon.pid, signal.SIGTERM)
        assert daemon.wait(60) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(30)
