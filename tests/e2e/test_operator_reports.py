"""Operator commands that say what they did, and a reload that keeps a live scale.

``offbroadway restart processor_default_1`` restarted both processors and the batchers
after them and requeued what they held, but printed only ``restart: ok``; a ``reload``
for an unrelated key (the log level) undid ``scale processors 4`` (``concurrency 4 -> 2``).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from offbroadway.supervision.tree import snapshot_nodes

from tests.conftest import REPO, offbroadway_cmd, start_daemon, test_env, wait_until
from tests.e2e.test_operations import cli, status
from tests.e2e.test_pipeline import make_config, write_spool
from tests.e2e.test_resize import shape_of


def running_processors(sock: Path) -> list[str]:
    return shape_of(status(sock))[0]


def test_restart_says_which_stages_restarted_and_how_many_were_requeued(short_tmp: Path
                                                                        ) -> None:
    n = 20_000
    write_spool(short_tmp / "spool", n, files=1, extra={"route": "default"})
    config = make_config(short_tmp, context={"slow": 0.002}, max_demand=200, batchers={
        "default": {"batch_size": 100, "batch_timeout": 0.3}})
    sock = short_tmp / "run" / "control.sock"
    log = short_tmp / "daemon.err"
    with open(log, "w") as err:      # a file, not a pipe nobody reads while it runs
        daemon = subprocess.Popen(offbroadway_cmd("run", str(config)), cwd=REPO,
                                  env=test_env(), stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_until(lambda: sock.exists() and any(
            n.get("messages", {}).get("inflight", 0) > 0
            for n in snapshot_nodes(status(sock)["tree"])),
                   timeout=60, message="messages in flight")
        out = cli("restart", "processor_default_1", "--socket", str(sock))
        assert out.returncode == 0, out.stderr
    finally:
        daemon.terminate()
        daemon.wait(60)
    said = out.stdout.strip()
    m = re.fullmatch(r"restart: restarted (.+) \(the cascade of processor_default_1\); "
                     r"(\d+) in-flight messages? requeued at the source", said)
    assert m, said
    assert m[1].split(", ") == ["processor_default_0", "processor_default_1",
                                "batcher_default", "batch_processor_default_0"], said
    # the producer's own log of the requeue says the same number
    logged = [int(k) for k in re.findall(r"producer_0: requeued (\d+) in-flight messages",
                                         log.read_text())]
    assert len(logged) == 1 and int(m[2]) == logged[0] > 0, (said, logged)


def test_a_reload_keeps_a_live_scale_unless_the_file_changed_it(short_tmp: Path) -> None:
    write_spool(short_tmp / "spool", 200_000, files=1, extra={"route": "default"})
    config = make_config(short_tmp, context={"slow": 0.001}, batchers={
        "default": {"batch_size": 100, "batch_timeout": 0.3}})
    sock = short_tmp / "run" / "control.sock"
    daemon = start_daemon(config)
    try:
        wait_until(lambda: sock.exists() and len(running_processors(sock)) == 2, timeout=60,
                   message="the daemon up")
        scaled = cli("scale", "processors", "4", "--socket", str(sock))
        assert scaled.returncode == 0, scaled.stderr
        assert len(running_processors(sock)) == 4

        # an unrelated key changes in the file: the scale stays
        config.write_text(config.read_text().replace("[runtime]\n",
                                                     '[runtime]\nlog_level = "debug"\n'))
        reloaded = cli("reload", "--socket", str(sock))
        assert reloaded.returncode == 0, reloaded.stderr
        assert "runtime.log_level 'info' -> 'debug'" in reloaded.stdout, reloaded.stdout
        assert "concurrency" not in reloaded.stdout, reloaded.stdout
        assert running_processors(sock) == [f"processor_default_{i}" for i in range(4)]

        # the file's own concurrency changes: the file wins
        config.write_text(config.read_text().replace("concurrency = 2", "concurrency = 3", 1))
        reloaded = cli("reload", "--socket", str(sock))
        assert reloaded.returncode == 0, reloaded.stderr
        assert "processors.default.concurrency 4 -> 3" in reloaded.stdout, reloaded.stdout
        assert running_processors(sock) == [f"processor_default_{i}" for i in range(3)]
    finally:
        daemon.terminate()
        assert daemon.wait(60) == 0
