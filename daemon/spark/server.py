"""The ``spark`` child: one Spark Connect server JVM, supervised like any stage.

Run as ``python -m offbroadway.daemon.spark.server``.  It is not a stage (no handler, no
wire protocol, no messages): the daemon's own child, so it lives here, and the stages know
nothing of it but the address and token the daemon hands the committers
(:mod:`offbroadway.stages.spark.spark_remote`).  The pipeline supervisor starts it first
(``rest_for_one``), so every committer after it is a light Spark Connect client of this
one driver instead of a JVM of its own (a classic session costs 0.4-0.9 GB and 6-9 s per
process on this machine).

Settings come from the environment, the record :class:`ServerSettings` (``to_env`` in the
daemon, afresh at every start, see :mod:`offbroadway.daemon.spark.wiring`; ``from_env`` here):

=================================  ========================================================
``OFFBROADWAY_SPARK_PORT``         gRPC port on 127.0.0.1 (required; ``0`` picks a free one
                                   and writes it to ``<dir>/spark-connect.port``)
``OFFBROADWAY_SPARK_TOKEN``        the Connect auth token (required; never printed/logged;
                                   the JVM gets it as ``SPARK_CONNECT_AUTHENTICATE_TOKEN``,
                                   never on its command line, which ``ps`` shows)
``OFFBROADWAY_SPARK_DIR``          state dir for logs, pid file, scratch and work dirs
                                   (required; never inside site-packages)
``OFFBROADWAY_SPARK_MASTER``       ``local[2]`` (default) or e.g. ``spark://127.0.0.1:7077``
``OFFBROADWAY_SPARK_DRIVER_MEMORY``  JVM heap of the driver (default ``1g``)
``OFFBROADWAY_SPARK_CONF``         extra Spark properties, a JSON object of strings
``OFFBROADWAY_SPARK_READY_TIMEOUT``  seconds to become ready before giving up (default 300;
                                   the supervisor's ``start_timeout`` usually fires first)
``OFFBROADWAY_SPARK_STOP_TIMEOUT``   seconds between SIGTERM and SIGKILL of the JVM
                                   (default 10; keep it below the supervisor's shutdown)
=================================  ========================================================

Files under ``<dir>``: ``logs/spark-connect.log`` (the JVM's stdout/stderr at WARN, plus this
wrapper's own lines), ``spark-connect.pid`` (the JVM's pid), ``conf/`` (the log4j2 config),
``tmp/`` (``SPARK_LOCAL_DIRS`` and ``java.io.tmpdir``, emptied at each start),
``work/`` (the JVM's cwd: warehouse, derby, stray files).

Life cycle, and why:

* The JVM is exec'd directly (``java ... SparkSubmit --class SparkConnectServer``), with the
  command line built by Spark's own launcher (``org.apache.spark.launcher.Main``, what
  ``spark-class`` runs), so the pid we hold *is* the JVM and the JVM options stay Spark's.
  (``bin/spark-submit`` also ends in ``exec java`` under the same pid; going direct saves a
  bash, a ``ps`` and ``find-spark-home`` and is the fallback-free path we measured.)
* ``PR_SET_PDEATHSIG = SIGKILL`` is set in the JVM before exec: if this wrapper dies, even by
  SIGKILL, the kernel kills the JVM.  The JVM also gets its own session so a terminal's
  Ctrl-C (SIGINT to the foreground group) never reaches it: shutdown is the daemon's call.
* Ready = the port accepts TCP *and* a trivial query over Connect with the token succeeds.
  The query runs in a short-lived subprocess (``--probe``) because the Connect client pulls
  in pandas, pyarrow and grpc (~135 MB, ~0.8 s): paying that once, in a process that exits,
  keeps this long-lived wrapper at ~20 MB.  The probe also runs one tiny Arrow-to-Parquet
  write so the JVM's first real batch does not pay the ~5 s of first-query warm-up.
* After ``notify_ready()`` it heartbeats every second while the JVM lives, exits 1 when the
  JVM dies, and on SIGTERM stops the JVM (SIGTERM, wait, SIGKILL) and exits 0.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from offbroadway.stages.runtime import logs
from offbroadway.stages.spark.spark_remote import ENV_TOKEN
from offbroadway.supervision import child
from offbroadway.supervision.linux.spawn import die_with

log = logging.getLogger("offbroadway.spark_server")

#: how the supervisor runs this module
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
#: the probe subprocess is told where to connect through this (the token via SPARK_TOKEN_ENV)
_ENV_PROBE_REMOTE = "OFFBROADWAY_SPARK_PROBE_REMOTE"

HOST = "127.0.0.1"
CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
LOG_NAME = "spark-connect.log"
PID_NAME = "spark-connect.pid"
PORT_NAME = "spark-connect.port"
LOG_ROTATE_BYTES = 64 * 1024 * 1024
LOG4J2_NAME = "log4j2.properties"
#: ``0`` turns the class-data-sharing archive off (:class:`Cds`)
ENV_CDS = "OFFBROADWAY_SPARK_CDS"

# WARN keeps the log to start/stop and real trouble: at INFO the Connect server writes
# ~20 lines per request, i.e. a growing file at ~10 writes/s.  The startup line stays.
LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yyyy-MM-dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.connect.name = org.apache.spark.sql.connect.service.SparkConnectServer
logger.connect.level = info
logger.parquet.name = org.apache.parquet.CorruptStatistics
logger.parquet.level = error
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
# "task of very large size": every local relation (our batches) is shipped in its task
logger.tsm.name = org.apache.spark.scheduler.TaskSetManager
logger.tsm.level = error
"""


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


def spark_args(settings: ServerSettings, port: int) -> list[str]:
    """SparkSubmit's arguments: everything bound to 127.0.0.1, scratch under our dir."""
    d = settings.dir
    conf = {
        "spark.connect.grpc.binding.address": HOST,
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": HOST,
        "spark.driver.bindAddress": HOST,
        "spark.ui.enabled": "false",
        "spark.sql.warehouse.dir": str(d / "work" / "warehouse"),
        "spark.sql.session.timeZone": "UTC",
        **settings.conf,
    }
    # java.io.tmpdir: Connect's per-session artifact dirs and the native libraries Spark
    # extracts (lz4, snappy) otherwise land in /tmp and outlive a SIGKILLed JVM.
    tmpdir = f"-Djava.io.tmpdir={d / 'tmp'}"
    extra = settings.conf.get("spark.driver.extraJavaOptions", "")
    conf["spark.driver.extraJavaOptions"] = f"{tmpdir} {extra}".strip()
    args = ["--master", settings.master, "--driver-memory", settings.driver_memory,
            "--name", "offbroadway-spark-connect"]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return [*args, "--class", CONNECT_CLASS, "spark-internal"]


def java_command(args: Sequence[str], env: Mapping[str, str], home: Path) -> list[str]:
    """Ask Spark's launcher for the exact JVM command ``spark-submit`` would exec.

    The launcher prints ``\\0\\n`` and then one NUL-terminated argument each (that is the
    format ``bin/spark-class`` parses).  Costs ~0.15 s of a small JVM, once per start.
    """
    java = str(Path(env["JAVA_HOME"]) / "bin" / "java") if env.get("JAVA_HOME") else "java"
    out = subprocess.run(
        [java, "-Xmx128m", "-cp", str(home / "jars" / "*"), "org.apache.spark.launcher.Main",
         "org.apache.spark.deploy.SparkSubmit", *args],
        env=dict(env), capture_output=True, timeout=120,
        preexec_fn=die_with(os.getpid()), check=False)
    marker = out.stdout.find(b"\0\n")
    if out.returncode != 0 or marker < 0:
        raise RuntimeError(f"Spark launcher failed (exit {out.returncode}): "
                           f"{out.stderr.decode(errors='replace').strip()[-500:]}")
    parts = out.stdout[marker + 2:].split(b"\0")
    cmd = [p.decode() for p in parts if p]
    if not cmd or "SparkSubmit" not in " ".join(cmd):
        raise RuntimeError("Spark launcher printed an unexpected command")
    return cmd


#: where the JVM's options end in the launcher's command
SUBMIT_CLASS = "org.apache.spark.deploy.SparkSubmit"


def cds_folder(environ: Mapping[str, str] | None = None) -> Path:
    """Where the archive lives: systemd's ``CacheDirectory=`` (``$CACHE_DIRECTORY``), else
    the user's cache (``$XDG_CACHE_HOME/offbroadway/spark-cds``, else ``~/.cache/…``),
    shared by every state dir of the user, since it depends only on the java binary and
    the class path: one dump per machine and pyspark version, not one per pipeline or
    test.  Not writable (a sandboxed unit without a cache dir): Spark starts without it."""
    env = os.environ if environ is None else environ
    if env.get("CACHE_DIRECTORY"):
        return Path(env["CACHE_DIRECTORY"].split(":")[0]) / "spark-cds"
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "offbroadway" / "spark-cds"


def without_conf_dir(cmd: Sequence[str], conf_dir: Path) -> list[str]:
    """The launcher's command with ``SPARK_CONF_DIR`` out of the class path: it is empty
    (the log4j2 config is named by a property), a CDS archive refuses a non-empty
    directory there, and without it the class path is the same for every state dir."""
    out = list(cmd)
    if "-cp" in out:
        i = out.index("-cp") + 1
        keep = [p for p in out[i].split(os.pathsep)
                if p.rstrip("/") != str(conf_dir).rstrip("/")]
        out[i] = os.pathsep.join(keep)
    return out


class Cds:
    """The JVM's class-data-sharing archive (AppCDS) for this java and class path.

    Why: the JVM's start was most of the README job's time (Spark loads ~18,000 classes:
    its own, Scala's, Netty's, gRPC's, each parsed, verified and linked at every start).
    A static archive holds them ready to map; measured in docs/benchmarks.md.  How, with
    Java 17 (no ``-XX:+AutoCreateSharedArchive`` before 19):

    1. a start without an archive records the classes it loads
       (``-XX:DumpLoadedClassList``; free), kept as the list once the server is ready;
    2. then ``java -Xshare:dump`` builds the archive from that list in a process of its
       own, at low priority (``nice``), while the server serves: a JVM's start worth of
       CPU (~30 s here), so not in the start's path (the "dynamic" archive a JVM can
       write at its exit took longer than the stop allows);
    3. later starts map it (``-XX:SharedArchiveFile``).

    One dump at a time per machine (an ``flock``).  A dump still running when the server
    stops gets what is left of the JVM's stop budget, then is killed, and the next start
    runs it again; one that fails is not tried again for this list (``*.failed``).  The
    name is a hash of the java binary, the class path and the module options, so a new
    JDK or pyspark gets a new archive rather than one the JVM refuses (it would then start
    without sharing, with a warning in the Spark log, never fail).
    ``OFFBROADWAY_SPARK_CDS=0`` turns all of it off.
    """

    def __init__(self, folder: Path, cmd: Sequence[str], say: Any) -> None:
        self.say = say
        self.java = cmd[0]
        end = list(cmd).index(SUBMIT_CLASS) if SUBMIT_CLASS in cmd else len(cmd)
        options = list(cmd[1:end])
        cp = options[options.index("-cp") + 1] if "-cp" in options else ""
        #: what CDS checks: the class path and the module options (not -D, not -Xmx)
        self.jvm_options = ["-cp", cp, *(o for o in options if o.startswith("--")
                                         or o == "-XX:+IgnoreUnrecognizedVMOptions")]
        stamp = ""
        for path in [self.java, *(p[:-1] for p in cp.split(os.pathsep) if p.endswith("*"))]:
            try:
                stamp += f":{Path(path).resolve()}@{Path(path).stat().st_mtime_ns}"
            except OSError:
                pass
        key = hashlib.sha256(f"{stamp}\0{' '.join(self.jvm_options)}".encode()).hexdigest()
        self.folder = folder
        base = folder / f"spark-{key[:16]}"
        self.archive = base.with_suffix(".jsa")
        self.classes = base.with_suffix(".classlist")
        self.failed = base.with_suffix(".failed")
        self.lock_path = base.with_suffix(".lock")
        self.recording = base.with_suffix(f".classlist.{os.getpid()}.recording")
        self.partial = base.with_suffix(f".jsa.{os.getpid()}.partial")
        self.proc: subprocess.Popen | None = None
        self.lock: int | None = None
        self.started = 0.0

    def options(self) -> list[str]:
        """The server JVM's options: map the archive, or record what it loads."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            return []
        if self.archive.is_file():
            self.say(f"class-data-sharing archive {self.archive}")
            return [f"-XX:SharedArchiveFile={self.archive}"]
        if self.classes.is_file() or self.failed.is_file():
            return []
        return [f"-XX:DumpLoadedClassList={self.recording}"]

    def recorded(self) -> None:
        """At ready: the classes loaded so far (start, session, first query) are the list."""
        try:
            if self.recording.stat().st_size > 0 and not self.classes.exists():
                shutil.copyfile(self.recording, self.partial)
                self.partial.replace(self.classes)
        except OSError:
            pass

    def dump(self) -> None:
        """Build the archive in the background, if there is a list, no archive yet, and no
        other server on this machine is building it."""
        if self.proc is not None or self.archive.is_file() or not self.classes.is_file() \
                or self.failed.is_file():
            return
        try:
            lock = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:   # another server is making it
            os.close(lock)
            return
        cmd = [self.java, "-Xshare:dump", f"-XX:SharedClassListFile={self.classes}",
               f"-XX:SharedArchiveFile={self.partial}", *self.jvm_options]
        parent = die_with(os.getpid())

        def preexec() -> None:
            parent()
            os.nice(10)

        try:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, preexec_fn=preexec)
        except OSError as exc:
            os.close(lock)
            self.say(f"class-data-sharing archive not made: {exc}", logging.WARNING)
            return
        self.lock = lock
        self.started = time.monotonic()
        self.say(f"making the class-data-sharing archive {self.archive} in the background "
                 f"(pid {self.proc.pid}); the next starts map it")

    def poll(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is None:
            return
        self.proc = None
        took = time.monotonic() - self.started
        if proc.returncode == 0 and self.partial.is_file():
            self.partial.replace(self.archive)
            self.say(f"class-data-sharing archive made in {took:.0f} s: {self.archive}")
        else:
            self.partial.unlink(missing_ok=True)
            try:
                self.classes.replace(self.failed)
            except OSError:
                pass
            self.say(f"class-data-sharing archive not made (java -Xshare:dump exited with "
                     f"{_describe(proc.returncode)}); Spark starts without it", logging.WARNING)
        self._unlock()

    def _unlock(self) -> None:
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None

    def stop(self, deadline: float) -> None:
        """The server stopped: a dump still running gets until ``deadline`` (what is left
        of the JVM's stop budget, so the stop's bound holds), then is killed (the next
        start runs it again)."""
        if self.proc is not None:
            try:
                self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.poll()
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            self.partial.unlink(missing_ok=True)
            self._unlock()
            self.say("class-data-sharing archive not finished before the stop; the next "
                     "start makes it")
        self.recording.unlink(missing_ok=True)


class Server:
    """One Connect server JVM and the wrapper's loop around it."""

    def __init__(self, settings: ServerSettings) -> None:
        self.s = settings
        self.home = spark_home()
        self.port = settings.port or free_port()
        self.proc: subprocess.Popen | None = None
        self.stopping = False
        self.log_path = settings.dir / "logs" / LOG_NAME
        self._log = None
        #: the class-data-sharing archive of this JVM's class path (None: turned off)
        self.cds: Cds | None = None

    # -- small helpers -----------------------------------------------------------------
    def say(self, text: str, level: int = logging.INFO) -> None:
        """A line for the daemon's log (stderr, in the pipeline's format: text or JSON, see
        :mod:`.logs`) and the same in the Spark log file."""
        log.log(level, "%s", text)
        if self._log is not None:
            line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} offbroadway.spark_server: {text}\n"
            self._log.write(line.encode())
            self._log.flush()

    def _prepare_dirs(self) -> None:
        d = self.s.dir
        # tmp/ is scratch of the previous JVM only (one server per dir): a SIGKILLed JVM
        # leaves block-manager, artifact and native-library files behind.
        shutil.rmtree(d / "tmp", ignore_errors=True)
        for sub in ("logs", "tmp", "work", "conf"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)   # the JVM's env holds the token; its scratch is ours only
        # conf/ stays empty: it is on the JVM's class path (SPARK_CONF_DIR), and a
        # class-data-sharing archive refuses a non-empty directory there (:class:`Cds`);
        # the log4j2 config is named by -Dlog4j2.configurationFile instead
        (d / "conf" / "log4j2.properties").unlink(missing_ok=True)
        (d / LOG4J2_NAME).write_text(LOG4J2)
        if self.log_path.exists() and self.log_path.stat().st_size > LOG_ROTATE_BYTES:
            self.log_path.replace(self.log_path.with_suffix(".log.1"))
        self._log = open(self.log_path, "ab", buffering=0)

    def jvm_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in (ENV_TOKEN, child.NOTIFY_FD_ENV, SPARK_TOKEN_ENV)}
        env.update({
            "SPARK_HOME": str(self.home),
            "SPARK_CONF_DIR": str(self.s.dir / "conf"),
            "SPARK_LOCAL_IP": HOST,
            # scratch (block manager, shuffle) under our dir, not /tmp; the env form, since
            # spark.local.dir draws a warning at every start
            "SPARK_LOCAL_DIRS": str(self.s.dir / "tmp"),
            "SPARK_SCALA_VERSION": env.get("SPARK_SCALA_VERSION", "2.13"),
            "PYTHONHASHSEED": "0",   # what bin/spark-submit exports
        })
        env[SPARK_TOKEN_ENV] = self.s.token
        return env

    # -- life cycle ----------------------------------------------------------------------
    def start(self) -> None:
        self._prepare_dirs()
        if not self.s.port:
            (self.s.dir / PORT_NAME).write_text(f"{self.port}\n")
        env = self.jvm_env()
        cmd = java_command(spark_args(self.s, self.port), env, self.home)
        cmd = [cmd[0], f"-Dlog4j2.configurationFile={self.s.dir / LOG4J2_NAME}", *cmd[1:]]
        if os.environ.get(ENV_CDS, "1") != "0":
            cmd = without_conf_dir(cmd, self.s.dir / "conf")
            self.cds = Cds(cds_folder(), cmd, self.say)
            cmd = [cmd[0], *self.cds.options(), *cmd[1:]]
            self.cds.dump()   # a list recorded by an earlier start: the archive now
        self.say(f"starting Spark Connect server on {HOST}:{self.port} "
                 f"(master {self.s.master}, driver memory {self.s.driver_memory}); "
                 f"log {self.log_path}")
        self.proc = subprocess.Popen(
            cmd, env=env, cwd=self.s.dir / "work", stdin=subprocess.DEVNULL,
            stdout=self._log, stderr=self._log, start_new_session=True,
            preexec_fn=die_with(os.getpid()))
        (self.s.dir / PID_NAME).write_text(f"{self.proc.pid}\n")

    def jvm_exit(self) -> int | None:
        assert self.proc is not None
        return self.proc.poll()

    def wait_ready(self) -> bool:
        """Poll until port + probe succeed.  False if stopped or the JVM died first."""
        t0 = time.monotonic()
        deadline = t0 + self.s.ready_timeout
        next_beat = 0.0
        port_seen = False
        while time.monotonic() < deadline:
            now = time.monotonic()
            if now >= next_beat:
                child.heartbeat()
                next_beat = now + 1.0
            if self.stopping or self.jvm_exit() is not None:
                return False
            if not port_seen:
                port_seen = port_open(self.port)
                if not port_seen:
                    time.sleep(0.1)
                    continue
                self.say(f"port {self.port} answers after {now - t0:.1f} s; probing")
            error = self._probe(deadline)
            if error is None:
                self.say(f"ready after {time.monotonic() - t0:.1f} s (JVM pid {self.proc.pid})")
                if self.cds is not None:   # the start's classes are loaded: archive them
                    self.cds.recorded()
                    self.cds.dump()
                return True
            if self.stopping or self.jvm_exit() is not None:
                return False
            self.say(f"probe failed, retrying: {error}", logging.WARNING)
            time.sleep(0.5)
        self.say(f"not ready within {self.s.ready_timeout:.0f} s", logging.ERROR)
        return False

    def _probe(self, deadline: float) -> str | None:
        """Run the Connect query in a subprocess; None on success, else its last words."""
        env = {k: v for k, v in os.environ.items() if k not in (ENV_TOKEN, child.NOTIFY_FD_ENV)}
        env.update({_ENV_PROBE_REMOTE: f"sc://localhost:{self.port}", SPARK_TOKEN_ENV: self.s.token,
                    ENV_DIR: str(self.s.dir)})
        probe = subprocess.Popen(
            [*ARGV, "--probe"], env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=die_with(os.getpid()))
        try:
            while True:
                try:
                    _, err = probe.communicate(timeout=1.0)
                    break
                except subprocess.TimeoutExpired:
                    child.heartbeat()
                    if self.stopping or self.jvm_exit() is not None or time.monotonic() > deadline:
                        probe.kill()
                        probe.communicate()
                        return "interrupted"
        finally:
            if probe.poll() is None:
                probe.kill()
                probe.wait()
        if probe.returncode == 0:
            return None
        lines = err.decode(errors="replace").strip().splitlines()
        return (lines[-1] if lines else f"exit {probe.returncode}")[:500]

    def serve(self) -> int:
        """Heartbeat while the JVM lives; the exit code tells the supervisor what happened."""
        assert self.proc is not None
        while not self.stopping:
            try:
                code = self.proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                child.heartbeat()
                if self.cds is not None:
                    self.cds.poll()
                continue
            if self.cds is not None:
                self.cds.stop(time.monotonic())
            self.say(f"Spark Connect server JVM exited with {_describe(code)}; see "
                     f"{self.log_path}", logging.ERROR)
            self._forget_pid()
            return 1
        return self.stop()

    def stop(self) -> int:
        """SIGTERM the JVM (Spark's shutdown hooks stop the context), SIGKILL at the deadline."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            if self.cds is not None:
                self.cds.stop(time.monotonic() + self.s.stop_timeout)
            if proc is not None:
                self._forget_pid()
            return 0
        self.say(f"stopping Spark Connect server (pid {proc.pid})")
        t0 = time.monotonic()
        proc.terminate()
        try:
            proc.wait(timeout=self.s.stop_timeout)
        except subprocess.TimeoutExpired:
            self.say(f"JVM still alive after {self.s.stop_timeout:.0f} s; killing it",
                     logging.WARNING)
            proc.kill()
            proc.wait()
        self.say(f"stopped in {time.monotonic() - t0:.1f} s")
        self._forget_pid()
        if self.cds is not None:   # what is left of the JVM's stop budget
            self.cds.stop(t0 + self.s.stop_timeout)
        return 0

    def _forget_pid(self) -> None:
        """No stale pid file: an operator's ``kill $(cat …)`` must not hit a reused pid."""
        try:
            (self.s.dir / PID_NAME).unlink()
        except FileNotFoundError:
            pass


def _describe(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"code {code}"


def run_probe() -> int:
    """``--probe``: one Connect session, ``range(1).count()`` and a tiny Arrow→Parquet write.

    The write warms the JVM's Arrow, planner and Parquet paths (the first query on a fresh
    server takes ~5 s here, later ones ~0.1 s) so the first real batch is not the slow one.
    It lands in ``<dir>/work/probe`` (overwritten each time).  The token comes from the
    ``SPARK_CONNECT_AUTHENTICATE_TOKEN`` environment, never the URL (URLs end up in errors).
    """
    import pyarrow as pa
    from pyspark.sql.connect.client import DefaultChannelBuilder
    from pyspark.sql.connect.session import SparkSession

    builder = DefaultChannelBuilder(os.environ[_ENV_PROBE_REMOTE])
    spark = SparkSession.builder.channelBuilder(builder).create()
    try:
        if spark.range(1).count() != 1:
            print("probe: range(1).count() != 1", file=sys.stderr)
            return 1
        target = Path(os.environ[ENV_DIR]) / "work" / "probe"
        spark.createDataFrame(pa.table({"x": [1]})).write.mode("overwrite").parquet(str(target))
    finally:
        spark.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] != ["--probe"]:
        # the pipeline's log format (text or JSON lines), as every stage has it
        logs.configure(os.environ.get(logs.LEVEL_ENV, "info"),
                       os.environ.get(logs.FORMAT_ENV, "text"), "spark")
        try:
            return _serve_main()
        except Exception:        # a bug here: one log record (JSON with "exc"), exit 1
            log.exception("spark server failed")
            return 1
    return _probe_main()


def _probe_main() -> int:
    try:
        return run_probe()
    except Exception as exc:   # the parent logs our last line; keep it to one line
        print(f"probe: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
              file=sys.stderr)
        return 1


def _serve_main() -> int:
    # Shutdown is the daemon's decision: ignore the terminal's SIGINT, act on SIGTERM.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        settings = ServerSettings.from_env()
    except SettingsError as exc:
        log.error("%s", exc)
        return 2
    server = Server(settings)

    def on_term(_signo: int, _frame: object) -> None:
        server.stopping = True

    signal.signal(signal.SIGTERM, on_term)
    try:
        server.start()
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        server.say(f"cannot start the Spark Connect server: {exc}", logging.ERROR)
        return 1
    if not server.wait_ready():
        if server.stopping:
            return server.stop()
        code = server.jvm_exit()
        if code is not None:
            server.say(f"Spark Connect server JVM exited with {_describe(code)} during start; "
                       f"see {server.log_path}", logging.ERROR)
        server.stop()
        return 1
    child.notify_ready()
    return server.serve()


if __name__ == "__main__":
    sys.exit(main())
