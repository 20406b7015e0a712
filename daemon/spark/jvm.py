"""The Spark Connect server's JVM: its command line (Spark's own launcher asked for it),
its arguments, its log4j2 settings, and its class-data-sharing archive (:class:`Cds`).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from offbroadway.supervision.spawn import die_with

from .settings import HOST, ServerSettings

CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
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
                     f"{describe_exit(proc.returncode)}); Spark starts without it", logging.WARNING)
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


def describe_exit(code: int) -> str:
    """A child's exit code as people say it: ``code 1``, ``signal SIGKILL``."""
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"code {code}"
