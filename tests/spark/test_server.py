"""The ``spark`` child's life cycle: ready, heartbeat, crash detection, no orphans, no leaks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.conftest import test_env, wait_until
from tests.spark.conftest import ServerHandle, launch_server, wait_ready

pytestmark = pytest.mark.spark


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_ready_heartbeats_and_token_never_leaks(spark_server: ServerHandle):
    jvm = spark_server.jvm_pid()
    assert _alive(jvm)
    assert psutil.Process(jvm).ppid() == spark_server.proc.pid   # the JVM itself, no wrapper
    assert b"R" in spark_server.events
    n = spark_server.events.count(b"H")
    wait_until(lambda: spark_server.events.count(b"H") > n, timeout=10,
               message="a heartbeat after ready")
    log = spark_server.log.read_text(errors="replace")
    out = spark_server.out.read_text(errors="replace")
    assert "Spark Connect server started" in log and "ready after" in out
    token = spark_server.token
    assert len(token) >= 32
    assert token not in log and token not in out
    assert token not in " ".join(psutil.Process(jvm).cmdline())
    assert token not in " ".join(psutil.Process(spark_server.proc.pid).cmdline())


@pytest.fixture(scope="module")
def throwaway_servers(tmp_path_factory: pytest.TempPathFactory):
    """Two servers started together (one each for the kill tests): one start-up's wait."""
    launched = [launch_server(tmp_path_factory.mktemp(f"spark-kill{i}")) for i in range(2)]
    try:
        for handle, r in launched:
            wait_ready(handle, r)
        yield [h for h, _ in launched]
    finally:
        for handle, _ in launched:
            if handle.proc.poll() is None:
                handle.proc.kill()
                handle.proc.wait()
            try:
                os.kill(handle.jvm_pid(), signal.SIGKILL)
            except (OSError, ValueError):
                pass


# throwaway JVMs of its own: long: not in the default run (pytest -m slow)
@pytest.mark.slow
def test_jvm_sigkill_makes_the_server_exit_nonzero(throwaway_servers):
    handle = throwaway_servers[0]
    os.kill(handle.jvm_pid(), signal.SIGKILL)
    code = handle.proc.wait(timeout=30)
    assert code != 0
    assert "exited with signal SIGKILL" in handle.out.read_text()


# throwaway JVMs of its own: long: not in the default run (pytest -m slow)
@pytest.mark.slow
def test_wrapper_sigkill_takes_the_jvm_down(throwaway_servers):
    handle = throwaway_servers[1]
    jvm = handle.jvm_pid()
    assert _alive(jvm)
    handle.proc.send_signal(signal.SIGKILL)
    handle.proc.wait(timeout=10)
    wait_until(lambda: not _alive(jvm), timeout=30, message="the JVM to die with its parent")


def test_missing_settings_exit_2_without_starting_java(tmp_path: Path):
    env = {k: v for k, v in test_env().items() if not k.startswith("OFFBROADWAY_SPARK")}
    p = subprocess.run([sys.executable, "-m", "offbroadway.daemon.spark.server"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "OFFBROADWAY_SPARK_PORT" in p.stderr
