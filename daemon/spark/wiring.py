"""Spark wiring: the ``[spark]`` config section → the ``spark`` child and the sink settings,
and the daemon's tree wired to that child (:class:`Wiring`).

:class:`Wiring` calls :func:`plan` once and hands the result to the topology builder
(:func:`..core.topology.build`, which knows the child only as a worker spec):

* ``child``: the local Spark Connect server's :class:`WorkerSpec` (``None`` when the config
  names a ``remote``).  Its ``env`` is a callable the supervisor evaluates at every start,
  so each incarnation gets a fresh random token (and a fresh free port when ``port = 0``).
* ``committer_env()``: evaluated at every committer start (the committers are the
  only Spark clients); it hands over the *current* incarnation's
  address and token (:func:`offbroadway.stages.spark.spark_remote.handover`).  The pipeline
  supervisor is ``rest_for_one`` with ``spark`` first, so a restarted server restarts
  every committer, which then reads the new values.
* ``settings`` (:func:`sink_settings`): the keyword arguments of
  :class:`offbroadway.stages.spark.spark_sink.SparkSink` (minus ``writer_id``/``on_wait``) plus
  the committer's ``commit_rows``, ``commit_interval`` and ``exactly_once``,
  JSON-serialisable and token-free: it travels in the stage spec, which is visible in
  ``/proc/<pid>/environ`` and may end up in logs.

The token lives only in these closures and in the two child environments; it is never
printed, logged or part of a spec the daemon shows.  Spark's files (log, pid, scratch)
live in ``<state_dir>/spark`` (see :mod:`.server`).

Nothing here imports pyspark: the daemon process stays light.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from offbroadway.stages.runtime.spec import JOURNAL_FOLDER, journal_file
from offbroadway.stages.spark import spark_remote
from offbroadway.supervision.spec import Restart, WorkerSpec

from ..config.names import PRODUCER, role_of
from ..config.records import Config, SparkConfig
from ..core import stopbudget
from ..core.topology import Topology, build, log_env
from .settings import ARGV, ServerSettings, free_port

#: the string hash seed of every producer this daemon starts (their restarts and a resize's
#: new producers included): a source that knows a message by ``hash()`` of its body
#: (RabbitMQ, without a ``message_id``) then knows it under one number in every producer's
#: process, and the daemon reconciles their failure books by it (core/failing.py).  Random
#: per daemon, so it stays unguessable from outside; the daemon's own if its environment
#: fixes one
HASH_SEED = (os.environ["PYTHONHASHSEED"] if os.environ.get("PYTHONHASHSEED", "").isdigit()
             else str(secrets.randbelow(2**32 - 1) + 1))

SPARK_CHILD_ID = "spark"

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


@dataclass(frozen=True)
class SparkPlan:
    child: WorkerSpec | None
    committer_env: Callable[[], dict[str, str]]
    settings: dict[str, Any]


class _Incarnation:
    """The address and token of the server incarnation started last (daemon-local)."""

    def __init__(self) -> None:
        self.port: int | None = None
        self.token: str | None = None

    def __repr__(self) -> str:   # never show the token, even in a debugger or traceback
        return f"_Incarnation(port={self.port})"


def catalog_conf(spark: SparkConfig, state_dir: str) -> dict[str, str]:
    """With ``[spark] table``: Spark's catalog kept on disk under the state dir (a Hive
    metastore in embedded Derby, the warehouse beside it), so the table outlives the
    server and any session opened with the same settings finds it by name
    (``offbroadway spark verify`` does).  Nothing without a table."""
    if not spark.table:
        return {}
    return {"spark.sql.catalogImplementation": "hive",
            "spark.sql.warehouse.dir": os.path.join(state_dir, "spark-warehouse"),
            "spark.hadoop.javax.jdo.option.ConnectionURL":
                f"jdbc:derby:;databaseName={os.path.join(state_dir, 'spark-metastore')};"
                f"create=true"}


def staging_root(state_dir: str) -> str:
    """Where batch processors stage their batches for Spark to read: under the daemon's
    state dir (the same rule as :func:`offbroadway.stages.spark.spark_staging.default_root`,
    which this module does not import: it pulls in pyarrow)."""
    return os.path.join(state_dir, "spark-staging")


def clear_staging(spark: SparkConfig, state_dir: str, batchers: list[str]) -> int:
    """Remove the staged batches once the pipeline's tree has stopped; how many.

    A committer keeps the files of its last commits while it runs (the ids in them are in
    doubt if a batch processor restarts, stages/roles/committer.py), and the next start
    sweeps whatever is left without reading it (the commit journal says what is in
    doubt then).  Once every stage has stopped nobody reads them: left behind they were
    dozens of files per run.  A staging area given as a URI (``hdfs://…``) is left to the
    next start's sweep, which opens it through pyarrow; the ``locks`` directory stays."""
    root = spark.staging or staging_root(state_dir)
    if "://" in root and not root.startswith("file://"):
        return 0
    root = root.removeprefix("file://")
    removed = 0
    for key in batchers:
        folder = os.path.join(root, key)
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if name.endswith(".parquet"):
                try:
                    os.unlink(os.path.join(folder, name))
                    removed += 1
                except OSError:
                    pass
    return removed


def journal_folder(state_dir: str) -> str:
    """Where the committers keep their journals of commit stamps (stages/spark/spark_once.py),
    one file per ``<pipeline>.<batcher>``."""
    return os.path.join(state_dir, JOURNAL_FOLDER)


def mark_journals_clean(spark: SparkConfig, state_dir: str, pipeline: str,
                        batchers: list[str]) -> int:
    """After a run that left nothing to come back (every message settled at its source,
    every committed row answered): each committer's journal says so, and the next start
    puts nothing in doubt.  How many journals were marked (none without exactly once)."""
    if not spark.exactly_once:
        return 0
    from offbroadway.stages.spark.spark_once import Journal  # pyarrow: only at the end

    marked = 0
    for key in batchers:
        path = journal_file(journal_folder(state_dir), pipeline, key)
        if os.path.exists(path):
            Journal(path).mark_clean()
            marked += 1
    return marked


def sink_settings(spark: SparkConfig, state_dir: str = "") -> dict[str, Any]:
    """What a committer's stage spec carries: the sink's keyword arguments and the group
    commit's, token-free (only where a remote's token is, never the token)."""
    settings: dict[str, Any] = {
        "staging": spark.staging or (staging_root(state_dir) if state_dir else None),
        # the committers' journals of commit stamps (stages/spark/spark_once.py): local state;
        # none without exactly_once (no journal, no ids in doubt: at-least-once)
        "journal": journal_folder(state_dir) if state_dir else None,
        "exactly_once": spark.exactly_once,
        "output": spark.output, "format": spark.format, "table": spark.table or None,
        "partition_by": list(spark.partition_by), "schema": spark.schema or None,
        "evolve": spark.evolve,
        "write_retry_seconds": spark.write_retry_seconds,
        "write_timeout": spark.write_timeout,
        "commit_rows": spark.commit_rows, "commit_interval": spark.commit_interval}
    settings["connect_timeout"] = spark.connect_timeout
    if spark.remote:
        settings["remote"] = spark.remote
        for key in ("token_env", "token_file", "use_ssl", "ca_file"):
            if getattr(spark, key):
                settings[key] = getattr(spark, key)
    return settings


def plan(spark: SparkConfig, *, runtime_dir: str, state_dir: str,
         log_env: dict[str, str] | None = None) -> SparkPlan:
    """Turn the validated ``[spark]`` section into the child spec, env and sink settings."""
    settings = sink_settings(spark, state_dir or runtime_dir)
    if spark.remote:
        # A remote Connect endpoint: no local server; the token comes from token_env or
        # token_file in the committer's own environment / filesystem.
        return SparkPlan(child=None, committer_env=lambda: {}, settings=settings)

    spark_dir = os.path.join(state_dir or runtime_dir, "spark")
    current = _Incarnation()

    def server_env() -> dict[str, str]:
        current.port = spark.port or free_port()
        current.token = secrets.token_urlsafe(32)
        server = ServerSettings(
            port=current.port, token=current.token, dir=Path(spark_dir), master=spark.master,
            driver_memory=spark.driver_memory,
            conf={**catalog_conf(spark, state_dir or runtime_dir), **spark.conf},
            stop_timeout=STOP_TIMEOUT)
        return {**server.to_env(), "SPARK_LOCAL_IP": "127.0.0.1",
                **(log_env or {})}     # the pipeline's log level and format, as every stage

    def committer_env() -> dict[str, str]:
        if current.port is None or current.token is None:
            return {}   # no server started yet: the sink then fails loudly on missing remote
        return spark_remote.handover(current.port, current.token)

    child = WorkerSpec(
        id=SPARK_CHILD_ID, argv=ARGV, env=server_env, restart=Restart.PERMANENT,
        shutdown=SHUTDOWN, start_timeout=START_TIMEOUT, heartbeat_timeout=HEARTBEAT_TIMEOUT,
        meta={"role": "spark", "dir": spark_dir})
    return SparkPlan(child=child, committer_env=committer_env, settings=settings)


class Wiring:
    """The daemon's recipe for its tree: :func:`..core.topology.build` with this daemon's
    one Spark server, planned once (the address and token its committers read belong to
    the incarnation that runs), so a resize's or a reload's tree is wired to the same
    server; each stage starts with the log settings of the config its spec was built from."""

    def __init__(self, config: Config) -> None:
        self.spark_child: WorkerSpec | None = None
        self.committer_env: Callable[[], dict[str, str]] | None = None
        #: what the committers are handed (None: no Spark sink)
        self.spark_settings: dict | None = None
        if config.spark is not None:
            rt = config.runtime
            spark = plan(config.spark, runtime_dir=rt.dir, state_dir=rt.state_dir,
                         log_env=log_env(config))
            self.spark_child, self.committer_env = spark.child, spark.committer_env
            self.spark_settings = spark.settings

    def build(self, config: Config) -> Topology:
        """``config``'s tree, wired to this daemon's Spark server; its producers share
        this daemon's :data:`HASH_SEED`."""
        env = log_env(config)
        producer_env = {**env, "PYTHONHASHSEED": HASH_SEED}
        return build(config, stage_env=lambda sid: producer_env if role_of(sid) == PRODUCER
                     else env, spark_child=self.spark_child,
                     committer_env=self.committer_env, spark_settings=self.spark_settings)


def wired(config: Config) -> Topology:
    """``config``'s tree as a daemon would run it, Spark server included (the stop budget,
    the chaos bench's predictions)."""
    return Wiring(config).build(config)


def stop_budget(config: Config) -> float:
    """The longest a stop of ``config``'s pipeline can take, as the daemon running it
    computes it (:mod:`..core.stopbudget`, over the tree :func:`wired` gives)."""
    return stopbudget.total(config.pipeline.shutdown_timeout, wired(config).root)
