"""Spark wiring: the ``[spark]`` config section → the ``spark`` child and the sink settings.

The daemon calls :func:`plan` once and hands the result to the topology builder:

* ``child``: the local Spark Connect server's :class:`WorkerSpec` (``None`` when the config
  names a ``remote``).  Its ``env`` is a callable the supervisor evaluates at every start,
  so each incarnation gets a fresh random token (and a fresh free port when ``port = 0``).
* ``batch_processor_env()``: evaluated at every committer start (the committers are the
  only Spark clients; the name is historical); it hands over the *current* incarnation's
  address and token (``OFFBROADWAY_SPARK_REMOTE``, ``OFFBROADWAY_SPARK_TOKEN``).  The
  pipeline supervisor is ``rest_for_one`` with ``spark`` first, so a restarted server
  restarts every committer, which then reads the new values.
* ``settings``: the keyword arguments of :class:`offbroadway.stages.spark_sink.SparkSink`
  (minus ``writer_id``/``on_wait``) plus the committer's ``commit_rows`` and
  ``commit_interval``, JSON-serialisable and token-free: it travels in the stage spec,
  which is visible in ``/proc/<pid>/environ`` and may end up in logs.

The token lives only in these closures and in the two child environments; it is never
printed, logged or part of a spec the daemon shows.  Spark's files (log, pid, scratch)
live in ``<state_dir>/spark`` (see :mod:`offbroadway.stages.spark_server`).

Nothing here imports pyspark: the daemon process stays light.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from dataclasses import dataclass
from typing import Any, Callable

from offbroadway.supervision.spec import Restart, WorkerSpec

SPARK_ARGV = (sys.executable, "-m", "offbroadway.stages.spark_server")
SPARK_CHILD_ID = "spark"

# The server's settings (read by offbroadway.stages.spark_server; names kept in step there).
ENV_PORT = "OFFBROADWAY_SPARK_PORT"
ENV_TOKEN = "OFFBROADWAY_SPARK_TOKEN"
ENV_DIR = "OFFBROADWAY_SPARK_DIR"
ENV_MASTER = "OFFBROADWAY_SPARK_MASTER"
ENV_DRIVER_MEMORY = "OFFBROADWAY_SPARK_DRIVER_MEMORY"
ENV_CONF = "OFFBROADWAY_SPARK_CONF"
ENV_STOP_TIMEOUT = "OFFBROADWAY_SPARK_STOP_TIMEOUT"
# What committers read (offbroadway.stages.spark_sink).
ENV_REMOTE = "OFFBROADWAY_SPARK_REMOTE"

#: Spark Connect takes ~10-15 s to become ready on an idle 2-core machine (JVM ~7 s, then
#: the probe's first query and warm-up write), and we measured 114 s at load average 10
#: (a standalone-cluster master): generous, so a slow start is not mistaken for a crash.
#: A JVM that dies during start is reported at once by the wrapper (exit 1) anyway; this
#: bound only catches a start that hangs.
START_TIMEOUT = 240.0
#: The server heartbeats every second; 30 s of silence means the wrapper is wedged.
HEARTBEAT_TIMEOUT = 30.0
#: The wrapper gives the JVM STOP_TIMEOUT after SIGTERM before SIGKILL; the supervisor
#: waits a little longer for the wrapper itself.
STOP_TIMEOUT = 10.0
SHUTDOWN = 15.0

SINK_KEYS = ("output", "format", "partition_by", "schema", "write_retry_seconds",
             "write_timeout", "commit_rows", "commit_interval")
REMOTE_KEYS = ("remote", "token_env", "token_file")


@dataclass(frozen=True)
class SparkPlan:
    child: WorkerSpec | None
    batch_processor_env: Callable[[], dict[str, str]]
    settings: dict[str, Any]


class _Incarnation:
    """The address and token of the server incarnation started last (daemon-local)."""

    def __init__(self) -> None:
        self.port: int | None = None
        self.token: str | None = None

    def __repr__(self) -> str:   # never show the token, even in a debugger or traceback
        return f"_Incarnation(port={self.port})"


def free_port(host: str = "127.0.0.1") -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def plan(spark: dict[str, Any], *, runtime_dir: str, state_dir: str,
         log_env: dict[str, str] | None = None) -> SparkPlan:
    """Turn the validated ``[spark]`` section into the child spec, env and sink settings."""
    settings: dict[str, Any] = {k: spark[k] for k in SINK_KEYS if k in spark}
    settings["partition_by"] = list(settings.get("partition_by") or [])
    settings["schema"] = settings.get("schema") or None
    if spark.get("remote"):
        # A remote Connect endpoint: no local server; the token comes from token_env or
        # token_file in the batch processor's own environment / filesystem.
        for key in REMOTE_KEYS:
            if spark.get(key):
                settings[key] = spark[key]
        return SparkPlan(child=None, batch_processor_env=lambda: {}, settings=settings)

    spark_dir = os.path.join(state_dir or runtime_dir, "spark")
    current = _Incarnation()
    fixed_port = int(spark.get("port") or 0)

    def server_env() -> dict[str, str]:
        current.port = fixed_port or free_port()
        current.token = secrets.token_urlsafe(32)
        env = {
            ENV_PORT: str(current.port),
            ENV_TOKEN: current.token,
            ENV_DIR: spark_dir,
            ENV_MASTER: spark.get("master") or "local[2]",
            ENV_DRIVER_MEMORY: spark.get("driver_memory") or "1g",
            ENV_STOP_TIMEOUT: str(STOP_TIMEOUT),
            "SPARK_LOCAL_IP": "127.0.0.1",
            **(log_env or {}),     # the pipeline's log level and format, as every stage
        }
        if spark.get("conf"):
            env[ENV_CONF] = json.dumps(dict(spark["conf"]))
        return env

    def batch_processor_env() -> dict[str, str]:
        if current.port is None or current.token is None:
            return {}   # no server started yet: the sink then fails loudly on missing remote
        return {ENV_REMOTE: f"sc://localhost:{current.port}", ENV_TOKEN: current.token}

    child = WorkerSpec(
        id=SPARK_CHILD_ID, argv=SPARK_ARGV, env=server_env, restart=Restart.PERMANENT,
        shutdown=SHUTDOWN, start_timeout=START_TIMEOUT, heartbeat_timeout=HEARTBEAT_TIMEOUT,
        meta={"role": "spark", "dir": spark_dir})
    return SparkPlan(child=child, batch_processor_env=batch_processor_env, settings=settings)
