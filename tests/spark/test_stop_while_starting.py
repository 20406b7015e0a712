"""A stop while the Spark server is still starting (issue 17): the daemon stops what has
started instead of first bringing the whole pipeline up, and meanwhile ``status`` shows the
``spark`` row with the JVM's memory (the wrapper's child), not the wrapper's 20 MB.

The server is pointed at a standalone master nobody listens on, so it never becomes ready:
the stop certainly arrives during the start, however loaded the machine is.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import psutil
import pytest
from offbroadway.supervision.tree import snapshot_find

from tests.conftest import REPO, offbroadway_cmd, test_env, wait_until
from tests.e2e.test_cli import cli, status
from tests.e2e.test_pipeline import make_config, write_spool
from tests.spark.test_pipeline_spark import spark_section

pytestmark = pytest.mark.spark
MIB = 1 << 20


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_stop_during_spark_start_does_not_start_the_pipeline(short_tmp: Path) -> None:
    write_spool(short_tmp / "spool", 10, files=1)
    config = make_config(short_tmp, batchers={"default": {"batch_size": 10}})
    config.write_text(config.read_text() + spark_section(
        short_tmp / "rows", master=f"spark://127.0.0.1:{closed_port()}"))
    log = short_tmp / "daemon.log"
    sock = short_tmp / "run" / "control.sock"
    with open(log, "w") as f:
        daemon = subprocess.Popen(offbroadway_cmd("run", str(config)), cwd=REPO, env=test_env(),
                                  stdout=f, stderr=subprocess.STDOUT, text=True)
    try:
        def spark_node() -> dict | None:
            s = sock.exists() and status(sock)
            return snapshot_find(s["tree"], "spark") if s else None

        # the JVM is up (its memory shows in the spark row) and the server is not ready
        node = wait_until(lambda: (n := spark_node()) and n.get("pid") and
                          n.get("rss_bytes", 0) > 150 * MIB and n, timeout=180,
                          message="the spark row to show the JVM's memory")
        assert node["state"] == "starting", node
        wrapper = psutil.Process(node["pid"]).memory_info().rss
        assert node["rss_bytes"] > 3 * wrapper, (node["rss_bytes"], wrapper)

        stop = cli("stop", "--timeout", "60", "--socket", str(sock))
        assert stop.returncode == 0, stop.stderr
        assert daemon.wait(10) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    text = log.read_text()
    assert "stop requested while starting" in text
    assert "worker producer_0" not in text          # no stage after spark was started
    assert " is up" not in text
    assert "Traceback" not in text
