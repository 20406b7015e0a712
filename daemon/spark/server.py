"""The ``spark`` child: one Spark Connect server JVM, supervised like any stage.

Run as ``python -m offbroadway.daemon.spark.server``.  It is not a stage (no handler, no
wire protocol, no messages): the daemon's own child, so it lives here, and the stages know
nothing of it but the address and token the daemon hands the committers
(:mod:`offbroadway.stages.spark.spark_remote`).  The pipeline supervisor starts it first
(``rest_for_one``), so every committer after it is a light Spark Connect client of this
one driver instead of a JVM of its own (a classic session costs 0.4-0.9 GB and 6-9 s per
process on this machine).

Settings come from the environment, the record :class:`.settings.ServerSettings`
(``to_env`` in the daemon, afresh at every start, see :mod:`.wiring`; ``from_env`` here);
the JVM's command line and its class-data-sharing archive are :mod:`.jvm`'s:

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

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from offbroadway.stages.runtime import logs
from offbroadway.stages.spark.spark_remote import ENV_TOKEN
from offbroadway.supervision import child
from offbroadway.supervision.spawn import die_with

from .jvm import (
    ENV_CDS,
    LOG4J2,
    LOG4J2_NAME,
    Cds,
    cds_folder,
    describe_exit,
    java_command,
    spark_args,
    without_conf_dir,
)
from .settings import (
    ARGV,
    ENV_DIR,
    HOST,
    SPARK_TOKEN_ENV,
    ServerSettings,
    SettingsError,
    free_port,
    port_open,
    spark_home,
)

log = logging.getLogger("offbroadway.spark_server")

#: the probe subprocess is told where to connect through this (the token via SPARK_TOKEN_ENV)
_ENV_PROBE_REMOTE = "OFFBROADWAY_SPARK_PROBE_REMOTE"
LOG_NAME = "spark-connect.log"
PID_NAME = "spark-connect.pid"
PORT_NAME = "spark-connect.port"
LOG_ROTATE_BYTES = 64 * 1024 * 1024


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
            self.say(f"Spark Connect server JVM exited with {describe_exit(code)}; see "
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
            server.say(f"Spark Connect server JVM exited with {describe_exit(code)} during start; "
                       f"see {server.log_path}", logging.ERROR)
        server.stop()
        return 1
    child.notify_ready()
    return server.serve()


if __name__ == "__main__":
    sys.exit(main())
