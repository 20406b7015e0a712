"""What a config is: the typed records of its sections with their defaults and limits, and
what a valid one implies (the unix sockets it binds, the warnings it earns).

:mod:`.load` reads the TOML into these records and checks every key; everything else in
the daemon only reads them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from offbroadway.stages.runtime.spec import DEFAULT_INTERVAL, DEFAULT_ROWS, PROCESSOR_KEY

from . import names
from .table import ConfigError

#: the control socket's name in the runtime dir (the daemon serves it, the CLI asks it)
CONTROL_SOCKET = "control.sock"
#: Unix socket paths are limited to 107 bytes (sun_path is 108 with its NUL); every stage
#: binds ``<runtime.dir>/<stage id>.sock``, so the runtime dir and the batcher keys (in the
#: batch processors' ids) must leave room for the longest one (see :func:`socket_paths`).
MAX_SOCKET_PATH = 107
#: the top-level sections a config may have
SECTIONS = ("pipeline", "producer", "processors", "batchers", "spark", "metrics", "runtime")
SOURCES = ("generator", "spool", "rabbitmq", "redis", "nats")
DISPATCHERS = ("spread", "demand")
SPARK_FORMATS = ("parquet", "json", "orc")
LOG_LEVELS = ("debug", "info", "warning", "error")
#: Group commit defaults: the committer's own (stages/runtime/spec.py, pure, no
#: pyarrow), named here for the config.  Measured end to end (docs/benchmarks.md, "Larger
#: commits"): jobs of 200,000 rows or 4 s cut the JVM's CPU per row from 19.7 to 7.5 us and
#: took the README's job from 0.55 to 0.89 of the plain loop; a lone message still lands
#: within batch_timeout + commit_interval (+ one job) of its arrival.
SPARK_COMMIT_ROWS = DEFAULT_ROWS
SPARK_COMMIT_INTERVAL = DEFAULT_INTERVAL


#: crashes blamed on one message before it is failed as poison (0: never)
DEFAULT_MAX_CRASHES = 3
#: the pipeline supervisor's window; its max_restarts defaults to max_crashes + 1
DEFAULT_PIPELINE_MAX_SECONDS = 10.0


@dataclass(frozen=True)
class PipelineConfig:
    name: str
    handler: str
    context: dict = field(default_factory=dict)
    shutdown_timeout: float = 30.0
    #: PipelineSupervisor's restart intensity: every processor crash costs one restart
    #: (the ProcessorSupervisor gives up at once, as in Broadway), so these decide how
    #: many crashes a poison message may cause before the daemon itself gives up.
    max_restarts: int = DEFAULT_MAX_CRASHES + 1
    max_seconds: float = DEFAULT_PIPELINE_MAX_SECONDS


@dataclass(frozen=True)
class ProducerConfig:
    source: str
    concurrency: int = 1
    options: dict = field(default_factory=dict)
    dispatcher: str = "spread"
    buffer_size: int = 10_000
    max_restarts: int = 3
    max_seconds: float = 5.0
    #: (allowed_messages, interval seconds) shared by all producers, or None: no limit
    rate_limit: tuple[int, float] | None = None


#: a processor's default budget: frames of hundreds of events keep the data plane at frame
#: speed (docs/benchmarks.md), and long jobs still go one at a time (the budget's prefetch
#: follows the measured pace, docs/design-demand.md)
DEFAULT_MAX_DEMAND = 1000


@dataclass(frozen=True)
class ProcessorConfig:
    concurrency: int = 2
    max_demand: int = DEFAULT_MAX_DEMAND
    min_demand: int = DEFAULT_MAX_DEMAND // 2
    partition_by: str | None = None
    heartbeat_timeout: float | None = 30.0
    memory_limit: int | None = None
    max_crashes: int = DEFAULT_MAX_CRASHES
    #: one callback call running longer fails its message (None: no bound)
    message_timeout: float | None = None


@dataclass(frozen=True)
class BatcherConfig:
    batch_size: int = 100
    batch_bytes: bool = False
    batch_timeout: float = 1.0
    concurrency: int = 1
    #: batches a batch processor may have asked for and not yet handled; None: about
    #: BATCH_RESERVE messages' worth, at least 2 (one in hand, one in reserve), see
    #: :func:`batch_demand`
    max_demand: int | None = None
    #: events the batcher asks from each processor
    upstream_demand: int = 1000
    partition_by: str | None = None
    heartbeat_timeout: float | None = None
    memory_limit: int | None = None


#: messages' worth of batches a batch processor asks for by default: with small batches,
#: one ask (and one wake-up of the batcher) per batch would cost more than the batch
BATCH_RESERVE = 1000


def batch_demand(b: BatcherConfig) -> int:
    """A batch processor's max_demand in batches: as configured, else enough batches for
    about :data:`BATCH_RESERVE` messages and at least 2; byte-sized batches keep 2 (each
    may be large)."""
    if b.max_demand is not None:
        return b.max_demand
    if b.batch_bytes:
        return 2
    return max(2, -(-BATCH_RESERVE // b.batch_size))


@dataclass(frozen=True)
class MetricsConfig:
    listen: str = "127.0.0.1:9464"


@dataclass(frozen=True)
class RuntimeConfig:
    dir: str
    state_dir: str
    log_level: str = "info"
    log_format: str = "text"


#: Spark properties the local server's wrapper sets itself: what it binds to and who may
#: connect (everything on 127.0.0.1, the token), and what has a key of its own here
SPARK_OWNED_CONF = {
    "spark.connect.grpc.binding.address": "the server binds 127.0.0.1 only",
    "spark.connect.grpc.binding.port": "use spark.port",
    "spark.driver.host": "the server binds 127.0.0.1 only",
    "spark.driver.bindAddress": "the server binds 127.0.0.1 only",
    "spark.master": "use spark.master",
    "spark.driver.memory": "use spark.driver_memory",
    "spark.connect.authenticate.token": "the daemon makes a fresh token at every start",
}


@dataclass(frozen=True)
class SparkConfig:
    """The ``[spark]`` section (docs/config.md): where and how the datasets are written,
    the local Spark server (or the ``remote`` one used instead), and the group commit."""

    output: str                         # absolute; one dataset per batcher under it
    format: str = "parquet"
    partition_by: tuple[str, ...] = ()
    schema: str = ""                    # DDL; empty: inferred from the first batch
    #: ``schema = "evolve"``: a new field becomes a new nullable column (no DDL then)
    evolve: bool = False
    master: str = "local[2]"
    driver_memory: str = "1g"
    port: int = 0                       # 0: a free port at every start
    #: extra Spark properties for the local server (flattened, values as strings)
    conf: dict[str, str] = field(default_factory=dict)
    remote: str = ""                    # sc://host:port: no local server
    token_env: str = ""
    token_file: str = ""                # absolute
    write_retry_seconds: float = 60.0
    write_timeout: float = 600.0
    commit_rows: int = SPARK_COMMIT_ROWS
    commit_interval: float = SPARK_COMMIT_INTERVAL
    #: where batch processors stage Parquet for Spark to read ("" = under state_dir)
    staging: str = ""
    #: a table of Spark's catalog instead of a dataset path ("{batcher}" in it: one each)
    table: str = ""
    #: the committer journals each commit's stamp and checks the ids in doubt after a
    #: restart (docs/design-spark.md §5); false: plain at-least-once, no journal, no check
    exactly_once: bool = True
    #: a remote's TLS: ``use_ssl`` (the bundled roots), or a PEM ``ca_file`` to trust
    use_ssl: bool = False
    ca_file: str = ""                   # absolute
    #: seconds a connection to Spark may take to come up before status calls it unreachable
    connect_timeout: float = 2.0


@dataclass(frozen=True)
class Config:
    pipeline: PipelineConfig
    producer: ProducerConfig
    processors: dict[str, ProcessorConfig]
    batchers: dict[str, BatcherConfig]
    spark: SparkConfig | None
    metrics: MetricsConfig
    runtime: RuntimeConfig
    path: str = ""


@dataclass(frozen=True)
class Loaded:
    config: Config
    warnings: list[str]


def socket_paths(config: Config) -> dict[str, str]:
    """Every unix socket the daemon and its stages bind → the config key that shapes its
    name (``runtime.dir`` for the fixed names, ``batchers.<key>`` for a batcher's stages).

    Every stage id comes from :func:`.names.pipeline_ids`, which the topology's own lists
    are built with, so a new stage or a longer name can never outgrow a length assumed
    here; validation does not build the tree (the topology imports this module).
    """
    from offbroadway.stages.runtime.spec import HUB

    rdir = config.runtime.dir
    out = {os.path.join(rdir, CONTROL_SOCKET): "runtime.dir",
           os.path.join(rdir, f"{HUB}.sock"): "runtime.dir"}
    owner = {}
    for key in config.batchers:
        owner[names.batcher_id(key)] = f"batchers.{key}"
        for bp in names.batch_processor_ids(key, config.batchers[key].concurrency):
            owner[bp] = f"batchers.{key}"
    stages = names.pipeline_ids(
        config.producer.concurrency, {k: p.concurrency for k, p in config.processors.items()},
        {k: b.concurrency for k, b in config.batchers.items()}, config.spark is not None)
    for sid in stages:
        out[os.path.join(rdir, f"{sid}.sock")] = owner.get(sid, "runtime.dir")
    return out


def check_socket_paths(config: Config) -> None:
    """Refuse a config whose unix socket paths would be too long (validation; a resize)."""
    too_long = [(len(os.fsencode(p)), p, key) for p, key in socket_paths(config).items()
                if len(os.fsencode(p)) > MAX_SOCKET_PATH]
    if not too_long:
        return
    size, path, key = max(too_long)
    # blame a batcher key only when the runtime dir alone fits
    if any(k == "runtime.dir" for _, _, k in too_long):
        key = "runtime.dir"
        size, path, _ = max(t for t in too_long if t[2] == "runtime.dir")
    fix = ("use a shorter runtime.dir" if key == "runtime.dir" else
           "use a shorter batcher key or a shorter runtime.dir")
    raise ConfigError(f"{key}: the socket {path!r} would be {size} bytes, over the "
                      f"{MAX_SOCKET_PATH}-byte limit of unix socket paths (too long for unix "
                      f"sockets); {fix} (runtime.dir is {len(config.runtime.dir)} characters)")


def warnings(config: Config) -> list[str]:
    """Settings that run but have a consequence the user should know about."""
    out: list[str] = []
    proc = config.processors[PROCESSOR_KEY]
    if proc.max_crashes and config.pipeline.max_restarts < proc.max_crashes:
        out.append(
            f"pipeline.max_restarts: {config.pipeline.max_restarts} restarts in "
            f"{config.pipeline.max_seconds:g}s is fewer than processors.{PROCESSOR_KEY}."
            f"max_crashes ({proc.max_crashes}): a poison message makes the daemon exit before "
            f"it is dead-lettered; use at least {proc.max_crashes + 1}")
    if config.spark is not None and config.spark.commit_rows < 5000:
        out.append(
            f"spark.commit_rows: {config.spark.commit_rows} rows per Spark job spends most "
            f"of the time in Spark's fixed per-job cost (0.1-0.3 s); 10000 or more amortizes it")
    from offbroadway.stages.sources import window_option as source_window

    window_option = source_window(config.producer.source)
    if window_option:
        prefetch = config.producer.options.get(window_option, "auto")
        need = proc.concurrency * proc.max_demand
        if isinstance(prefetch, int) and not isinstance(prefetch, bool) \
                and prefetch * config.producer.concurrency < need:
            out.append(
                f"producer.options.{window_option}: {prefetch} per producer is below "
                f"processors x max_demand ({need}): processors will starve waiting for "
                f"deliveries; use 'auto' or at least {need // config.producer.concurrency + 1}")
    return out
