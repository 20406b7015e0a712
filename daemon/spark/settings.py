"""What the daemon tells the ``spark`` child, and where the child listens.

:class:`ServerSettings` is the one definition of the server's environment: the daemon
writes it afresh at every start (``to_env``, :mod:`.wiring`), the child reads it back
(``from_env``, :mod:`.server`); :data:`ARGV` is how the supervisor runs the child.  The
server binds 127.0.0.1 only (:data:`HOST`); :func:`free_port` is the port ``port = 0``
gives it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from offbroadway.stages.spark.spark_remote import ENV_TOKEN

#: how the supervisor runs the child (:mod:`.server`)
ARGV = (sys.executable, "-m", "offbroadway.daemon.spark.server")
ENV_PORT = "OFFBROADWAY_SPARK_PORT"
ENV_DIR = "OFFBROADWAY_SPARK_DIR"
ENV_MASTER = "OFFBROADWAY_SPARK_MASTER"
ENV_DRIVER_MEMORY = "OFFBROADWAY_SPARK_DRIVER_MEMORY"
ENV_CONF = "OFFBROADWAY_SPARK_CONF"
ENV_READY_TIMEOUT = "OFFBROADWAY_SPARK_READY_TIMEOUT"
ENV_STOP_TIMEOUT = "OFFBROADWAY_SPARK_STOP_TIMEOUT"
#: how Spark itself (server and pyspark client) reads the token
SPARK_TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
HOST = "127.0.0.1"


class SettingsError(ValueError):
    """The environment does not describe a server we can start (exit code 2)."""


@dataclass(frozen=True)
class ServerSettings:
    port: int
    token: str = field(repr=False)   # repr=False: a traceback or log of settings hides it
    dir: Path
    master: str = "local[2]"
    driver_memory: str = "1g"
    conf: Mapping[str, str] = field(default_factory=dict)
    ready_timeout: float = 300.0
    stop_timeout: float = 10.0

    def to_env(self) -> dict[str, str]:
        """The environment that :meth:`from_env` reads back (the token included: the
        daemon hands it to this process only)."""
        env = {ENV_PORT: str(self.port), ENV_TOKEN: self.token, ENV_DIR: str(self.dir),
               ENV_MASTER: self.master, ENV_DRIVER_MEMORY: self.driver_memory,
               ENV_READY_TIMEOUT: str(self.ready_timeout),
               ENV_STOP_TIMEOUT: str(self.stop_timeout)}
        if self.conf:
            env[ENV_CONF] = json.dumps(dict(self.conf))
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ServerSettings:
        env = os.environ if environ is None else environ
        missing = [k for k in (ENV_PORT, ENV_TOKEN, ENV_DIR) if not env.get(k)]
        if missing:
            raise SettingsError(f"missing environment: {', '.join(missing)}")
        try:
            port = int(env[ENV_PORT])
        except ValueError:
            raise SettingsError(f"{ENV_PORT} is not an integer") from None
        if not 0 <= port < 65536:
            raise SettingsError(f"{ENV_PORT}={port} is out of range")
        directory = Path(env[ENV_DIR]).resolve()
        home = spark_home()
        if directory == home or home in directory.parents:
            raise SettingsError(f"{ENV_DIR} must not be inside the pyspark package ({home})")
        try:
            conf = json.loads(env.get(ENV_CONF) or "{}")
        except json.JSONDecodeError as exc:
            raise SettingsError(f"{ENV_CONF} is not JSON: {exc}") from None
        if not isinstance(conf, dict):
            raise SettingsError(f"{ENV_CONF} must be a JSON object")
        conf = {str(k): str(v) for k, v in conf.items()}
        try:
            ready = float(env.get(ENV_READY_TIMEOUT) or 300.0)
            stop = float(env.get(ENV_STOP_TIMEOUT) or 10.0)
        except ValueError:
            raise SettingsError(f"{ENV_READY_TIMEOUT}/{ENV_STOP_TIMEOUT} must be numbers") from None
        return cls(port=port, token=env[ENV_TOKEN], dir=directory,
                   master=env.get(ENV_MASTER) or "local[2]",
                   driver_memory=env.get(ENV_DRIVER_MEMORY) or "1g", conf=conf,
                   ready_timeout=ready, stop_timeout=stop)


def spark_home() -> Path:
    """The pyspark package directory (jars/, bin/), found without importing pyspark."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise SettingsError("pyspark is not installed (pip install 'offbroadway[spark]')")
    return Path(spec.origin).resolve().parent


def free_port(host: str = HOST) -> int:
    """A port the kernel just handed out on ``host``: free now, with a small race until the
    JVM binds it (a lost race makes the JVM exit, and the supervisor restarts us)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_open(port: int, host: str = HOST, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
