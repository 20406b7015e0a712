"""Shared test helpers: polling with a deadline (never a bare sleep standing in for a
condition) and running the real daemon as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, TypeVar

import pytest

# The test process itself loads gRPC (the Spark tests talk to Spark Connect in-process),
# and some supervision tests fork with a Python ``preexec_fn``: gRPC's fork handlers then
# restart its poller in the forked child, which can abort it (SIGABRT) before it execs.
# The daemon never loads gRPC (only its CLI's ``spark`` commands and the committer, which
# forks nothing), so this is the test process's own hazard.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
from offbroadway.daemon.spark.settings import free_port  # noqa: F401 (re-exported: one definition)

REPO = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.02,
               message: str = "condition") -> T:
    """Poll ``predicate`` until it returns something truthy; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def offbroadway_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "offbroadway.daemon.cli", *args]


def test_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


test_env.__test__ = False  # type: ignore[attr-defined]


def env_with_site(tmp: Path, sitecustomize: str, **variables: str) -> dict[str, str]:
    """:func:`test_env` whose every Python process (the daemon and each of its stages) runs
    ``sitecustomize`` first, from ``tmp/site``: a test's way to hold a stage at one point of
    the real code, armed through ``variables`` (the environment it adds)."""
    site = tmp / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(sitecustomize)
    env = test_env()
    env["PYTHONPATH"] = f"{site}{os.pathsep}{env['PYTHONPATH']}"
    env.update(variables)
    return env


@pytest.fixture
def short_tmp():
    """A short directory for runtime dirs: unix socket paths are limited to 107 bytes."""
    import shutil
    import tempfile

    d = tempfile.mkdtemp(prefix="ob-", dir="/tmp")
    os.chmod(d, 0o700)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def start_daemon(config: Path, *extra: str, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen(offbroadway_cmd("run", str(config), *extra), cwd=cwd or REPO,
                            env=test_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@pytest.fixture(scope="session")
def spark_server(tmp_path_factory: pytest.TempPathFactory):
    """One Spark Connect server for the whole session, shared by tests/spark and
    tests/chaos: a JVM start costs 20-30 s and about 1 GB here (see tests/spark/conftest.py
    for how it is started, exactly as the daemon starts its own)."""
    from tests.spark.conftest import start_server

    handle = start_server(tmp_path_factory.mktemp("spark"))
    yield handle
    code = handle.stop()
    assert code == 0, f"spark_server exited with {code} on SIGTERM"
