"""Real local Spark for the sink and server tests: one Connect server shared by the session.

The server is started exactly as the daemon starts it: argv and environment come from
:func:`offbroadway.daemon.spark.wiring.plan` (fresh port and token), the notify pipe is a real
pipe, and "started" means the ``R`` byte arrived.  Starting Spark costs 8-20 s here, so
only the tests that kill a server start their own.  The session's server itself, the
``spark_server`` fixture, is in tests/conftest.py so that tests/chaos shares it.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest
from offbroadway.daemon.config.records import SparkConfig
from offbroadway.daemon.spark.wiring import plan
from offbroadway.supervision.child import NOTIFY_FD_ENV

from tests.conftest import test_env

READY_TIMEOUT = 240.0   # a JVM start on 2 busy cores; normally 8-20 s


@dataclass
class ServerHandle:
    """A running ``offbroadway.daemon.spark.server`` and what a client needs to use it."""

    proc: subprocess.Popen
    dir: Path
    out: Path                       # the wrapper's stdout+stderr
    token: str = field(repr=False)
    remote: str
    bp_env: dict[str, str] = field(repr=False)
    events: list[bytes] = field(default_factory=list)
    ready_after: float = 0.0

    @property
    def log(self) -> Path:
        return self.dir / "logs" / "spark-connect.log"

    def jvm_pid(self) -> int:
        return int((self.dir / "spark-connect.pid").read_text())

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)


def spark_config(root: Path, **overrides: Any) -> SparkConfig:
    """A validated ``[spark]`` section, as daemon/config/load.py makes it."""
    return SparkConfig(output=str(root / "out"), **overrides)


def launch_server(root: Path, *, wrap: Sequence[str] = (), port: int = 0,
                  token: str | None = None,
                  conf: dict[str, str] | None = None) -> tuple[ServerHandle, int]:
    """Start the server as the supervisor would; return it and the notify pipe's read end.
    ``wrap``: a command it runs under (``ip netns exec NS``); ``port``: a fixed one;
    ``token``: a given one (a restart on the same address, with the same credential);
    ``conf``: extra Spark properties (``[spark] conf``)."""
    root.mkdir(parents=True, exist_ok=True)
    overrides: dict[str, Any] = {"port": port} if port else {}
    if conf:
        overrides["conf"] = dict(conf)
    p = plan(spark_config(root, **overrides), runtime_dir=str(root),
             state_dir=str(root / "state"))
    assert p.child is not None
    child_env = dict(p.child.env())  # type: ignore[operator]
    if token is not None:
        child_env["OFFBROADWAY_SPARK_TOKEN"] = token
    r, w = os.pipe()
    env = {**test_env(), **child_env, NOTIFY_FD_ENV: str(w)}
    out = root / "server.out"
    with open(out, "wb") as fh:
        proc = subprocess.Popen([*wrap, *p.child.argv], env=env, pass_fds=(w,), stdout=fh,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    os.close(w)
    bp_env = p.committer_env()
    handle = ServerHandle(proc=proc, dir=Path(child_env["OFFBROADWAY_SPARK_DIR"]), out=out,
                          token=child_env["OFFBROADWAY_SPARK_TOKEN"],
                          remote=bp_env["OFFBROADWAY_SPARK_REMOTE"], bp_env=bp_env)
    return handle, r


def wait_ready(handle: ServerHandle, r: int, timeout: float = READY_TIMEOUT) -> None:
    """Block until ``R`` on the notify pipe, then keep draining it (heartbeats) in a thread."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    while b"R" not in handle.events:
        if handle.proc.poll() is not None:
            raise AssertionError(f"spark_server exited with {handle.proc.returncode} before "
                                 f"ready:\n{handle.out.read_text()[-3000:]}")
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"spark_server not ready within {timeout}s:\n"
                                 f"{handle.out.read_text()[-3000:]}")
        readable, _, _ = select.select([r], [], [], min(1.0, left))
        if readable:
            data = os.read(r, 1024)
            if not data:
                continue
            handle.events.extend(bytes([b]) for b in data)
    handle.ready_after = time.monotonic() - t0

    def drain() -> None:
        while True:
            try:
                data = os.read(r, 1024)
            except OSError:
                return
            if not data:
                os.close(r)
                return
            handle.events.extend(bytes([b]) for b in data)

    threading.Thread(target=drain, daemon=True).start()


def start_server(root: Path, **launch: Any) -> ServerHandle:
    handle, r = launch_server(root, **launch)
    try:
        wait_ready(handle, r)
    except BaseException:
        handle.proc.kill()
        handle.proc.wait()
        raise
    return handle


@pytest.fixture(scope="session")
def spark(spark_server: ServerHandle) -> Iterator[Any]:
    """A Connect session for reading results back (the same kind of client as the sink)."""
    from pyspark.sql.connect.client import DefaultChannelBuilder
    from pyspark.sql.connect.session import SparkSession

    builder = DefaultChannelBuilder(spark_server.remote)
    builder.set("token", spark_server.token)
    session = SparkSession.builder.channelBuilder(builder).create()
    yield session
    if spark_server.proc.poll() is None:   # stopping against a dead server retries for minutes
        session.stop()


@pytest.fixture
def sink_env(spark_server: ServerHandle, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment a batch processor gets: the current server's remote and token."""
    for key, value in spark_server.bp_env.items():
        monkeypatch.setenv(key, value)
    return dict(spark_server.bp_env)
