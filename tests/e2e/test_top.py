"""``offbroadway top`` in a real terminal: tmux at 80x24 (issue 17).

The header and every stage's row are visible, no line wraps, ``q`` quits with exit 0, and
a daemon that stops ends ``top`` with exit 0 and a message.  tmux is a real terminal
emulator: what ``capture-pane`` returns is what an operator would see.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from offbroadway.supervision.tree import snapshot_nodes

from tests.conftest import REPO, test_env, wait_until
from tests.e2e.test_cli import cli, start, status
from tests.e2e.test_pipeline import make_config, write_spool

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (.ci/run installs it)")
WIDTH, HEIGHT = 80, 24


class Tmux:
    """A private tmux server (its own socket name) with one window of a fixed size."""

    def __init__(self) -> None:
        self.name = f"obtop-{uuid.uuid4().hex[:8]}"

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-L", self.name, *args], capture_output=True, text=True,
                              env=test_env(), timeout=30)

    def start(self, command: str) -> None:
        res = self.run("new-session", "-d", "-s", "t", "-x", str(WIDTH), "-y", str(HEIGHT),
                       command)
        assert res.returncode == 0, res.stderr
        self.run("set-option", "-t", "t", "remain-on-exit", "on")

    def screen(self, history: bool = False) -> list[str]:
        """The visible screen (with ``history``, what scrolled off the top too)."""
        extra = ["-S", "-100"] if history else []
        return self.run("capture-pane", "-p", *extra, "-t", "t").stdout.splitlines()

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", "t", *keys)

    def close(self) -> None:
        self.run("kill-server")
        # tmux leaves its socket file behind
        path = Path(os.environ.get("TMUX_TMPDIR", "/tmp")) / f"tmux-{os.getuid()}" / self.name
        path.unlink(missing_ok=True)


def top_command(sock: Path, exit_file: Path) -> str:
    top = " ".join(shlex.quote(a) for a in (sys.executable, "-m", "offbroadway.daemon.cli",
                                             "top", "--interval", "0.5", "--socket", str(sock)))
    return f"cd {shlex.quote(str(REPO))} && {top}; echo $? > {shlex.quote(str(exit_file))}"


def test_top_fits_80x24_and_q_quits(short_tmp: Path) -> None:
    write_spool(short_tmp / "spool", 20_000, files=2)
    config = make_config(short_tmp, context={"slow": 0.002},
                         batchers={"even": {"batch_size": 100, "batch_timeout": 0.5},
                                   "odd": {"batch_size": 100, "batch_timeout": 0.5}})
    sock = short_tmp / "run" / "control.sock"
    daemon = start(config, short_tmp / "daemon.log")
    tmux = Tmux()
    exit_file = short_tmp / "top.exit"
    try:
        s = wait_until(lambda: sock.exists() and (st := status(sock)) and all(
            n["state"] == "running" for n in snapshot_nodes(st["tree"])) and st, timeout=60,
            message="every child running")
        nodes = list(snapshot_nodes(s["tree"]))
        # every stage by its full id; a supervisor's long id may be shortened ("~")
        stages = [n["id"] for n in nodes if n["kind"] == "worker"]
        tmux.start(top_command(sock, exit_file))

        def shown() -> list[str] | None:
            screen = tmux.screen()
            words = {ln.split()[0] for ln in screen if ln.strip()}
            return screen if screen and screen[0].startswith("pipeline e2e") and \
                set(stages) <= words else None

        screen = wait_until(shown, timeout=30, message="top showing the header and every row")
        assert screen[0].startswith("pipeline e2e  up "), screen[0]
        titles = next(i for i, ln in enumerate(screen) if ln.split()[:2] == ["id", "pid"]
                      or ln.split()[:2] == ["id", "state"])
        assert all(w in screen[titles] for w in ("state", "in", "out", "failed", "out/s"))
        assert all(len(ln) <= WIDTH for ln in screen)
        # one line per node of the tree, in order, right under the titles: nothing
        # wrapped onto a second line, nothing scrolled away
        rows = screen[titles + 1:titles + 1 + len(nodes)]
        for node, row in zip(nodes, rows):
            shown_id = row.split()[0]
            assert node["id"] == shown_id or (shown_id.endswith("~") and node["id"].startswith(
                shown_id[:-1])), (node["id"], row)
        # the rates are there: the producer's row has a number under out/s
        producer_row = next(r for r in rows if r.split()[0] == "producer_0")
        assert producer_row.split()[-1].isdigit(), producer_row
        tmux.keys("q")
        wait_until(lambda: exit_file.exists() and exit_file.read_text().strip(), timeout=15,
                   message="top to exit after q")
        assert exit_file.read_text().strip() == "0"
        assert daemon.poll() is None        # top quit; the daemon did not notice
    finally:
        tmux.close()
        cli("stop", "--socket", str(sock))
        if daemon.poll() is None:
            daemon.kill()
        daemon.wait()


def test_top_exits_0_when_the_daemon_stops(short_tmp: Path) -> None:
    write_spool(short_tmp / "spool", 10, files=1)
    config = make_config(short_tmp)
    sock = short_tmp / "run" / "control.sock"
    daemon = start(config, short_tmp / "daemon.log")
    tmux = Tmux()
    exit_file = short_tmp / "top.exit"
    try:
        wait_until(lambda: sock.exists() and status(sock), timeout=60, message="the daemon")
        tmux.start(top_command(sock, exit_file))
        wait_until(lambda: "pipeline e2e" in "\n".join(tmux.screen()), timeout=30,
                   message="top running")
        assert cli("stop", "--no-wait", "--socket", str(sock)).returncode == 0
        assert daemon.wait(30) == 0
        wait_until(lambda: exit_file.exists() and exit_file.read_text().strip(), timeout=15,
                   message="top to exit after the daemon")
        assert exit_file.read_text().strip() == "0"
        assert "the daemon has stopped" in "\n".join(tmux.screen(history=True))
    finally:
        tmux.close()
        if daemon.poll() is None:
            daemon.kill()
        daemon.wait()
