"""The pipeline config: TOML in, a validated, typed :class:`~.records.Config` out.

Validation is a pure function of the parsed TOML (no processes, no imports of user code:
what looks at the machine or imports user code is :mod:`.checks`), so ``offbroadway
check`` and ``offbroadway run`` agree and tests need nothing but a dict.  Every error names
the dotted key it is about (the tables are read through :class:`.table.Table`), and
the CLI exits 2 on them.  Warnings are consequences the user may accept (a pitfall such as a
prefetch too small for the processors) and are printed, never fatal.
"""

from __future__ import annotations

import os
import re
import tomllib
from typing import Any

from offbroadway.stages.runtime.spec import PROCESSOR_KEY

from .records import (
    DEFAULT_MAX_CRASHES,
    DEFAULT_MAX_DEMAND,
    DEFAULT_PIPELINE_MAX_SECONDS,
    DISPATCHERS,
    LOG_LEVELS,
    SECTIONS,
    SOURCES,
    SPARK_COMMIT_INTERVAL,
    SPARK_COMMIT_ROWS,
    SPARK_FORMATS,
    SPARK_OWNED_CONF,
    BatcherConfig,
    Config,
    Loaded,
    MetricsConfig,
    PipelineConfig,
    ProcessorConfig,
    ProducerConfig,
    RuntimeConfig,
    SparkConfig,
    check_socket_paths,
    warnings,
)
from .table import ConfigError, parse_size  # noqa: F401  (re-exported for callers of config)
from .table import Table as _Table
from .table import did_you_mean as _did_you_mean
from .table import non_negative as _non_negative
from .table import one_of as _one_of
from .table import optional_duration as _optional_duration
from .table import positive as _positive
from .table import size_option as _size

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_HANDLER = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _name_check(v: str) -> str | None:
    return None if _NAME.match(v) else "must be 1-64 letters, digits, '_', '.', '-'"


def _source_check(v: str) -> str | None:
    """A built-in source's name, or ``package.module:ClassName`` for one of your own (it
    is imported and checked by :func:`.checks.check_source`, not here: validation imports no user
    code)."""
    if v in SOURCES or _HANDLER.match(v):
        return None
    return (f"must be one of {', '.join(SOURCES)}, or 'package.module:ClassName' for your "
            f"own source")


def _handler_check(v: str) -> str | None:
    return None if _HANDLER.match(v) else "must be 'package.module:ClassName'"


# -- sections ---------------------------------------------------------------------------------

def _pipeline(t: _Table, max_crashes: int) -> PipelineConfig:
    out = PipelineConfig(
        name=t.get("name", str, required=True, check=_name_check),
        handler=t.get("handler", str, required=True, check=_handler_check),
        context=t.get("context", dict, {}),
        shutdown_timeout=t.get("shutdown_timeout", float, 30.0, check=_positive),
        # one poison message's crashes, and one to spare (an isolating prepare_messages
        # crash, or an unrelated one), fit; a crash loop still exceeds it (docs/operations)
        max_restarts=t.get("max_restarts", int, max(3, max_crashes + 1),
                           check=_non_negative),
        max_seconds=t.get("max_seconds", float, DEFAULT_PIPELINE_MAX_SECONDS,
                          check=_positive))
    t.done()
    return out


def _producer(t: _Table) -> ProducerConfig:
    out = ProducerConfig(
        source=t.get("source", str, required=True, check=_source_check),
        concurrency=t.get("concurrency", int, 1, check=_positive),
        options=t.get("options", dict, {}),
        dispatcher=t.get("dispatcher", str, "spread", check=_one_of(DISPATCHERS)),
        buffer_size=t.get("buffer_size", int, 10_000, check=_positive),
        max_restarts=t.get("max_restarts", int, 3, check=_non_negative),
        max_seconds=t.get("max_seconds", float, 5.0, check=_positive),
        rate_limit=_rate_limit(t))
    t.done()
    return out


def _rate_limit(t: _Table) -> tuple[int, float] | None:
    """``rate_limit = { allowed_messages = N, interval = seconds }`` (Broadway's
    ``rate_limiting``): at most N messages fetched per interval by all producers together."""
    raw = t.get("rate_limit", dict, None)
    if raw is None:
        return None
    r = _Table(raw, t.key("rate_limit"))
    allowed = r.get("allowed_messages", int, required=True, check=_positive)
    interval = r.get("interval", float, required=True, check=lambda v: None if
                     0 < v <= 86400 else "must be more than 0 and at most 86400 seconds")
    r.done()
    return allowed, interval


def _processors(t: _Table) -> dict[str, ProcessorConfig]:
    out = {}
    for key in list(t.raw):
        if key != PROCESSOR_KEY:
            raise ConfigError(f"{t.key(key)}: unknown processor key (only "
                              f"[processors.{PROCESSOR_KEY}] is supported, as in Broadway)")
    p = t.table(PROCESSOR_KEY)
    max_demand = p.get("max_demand", int, DEFAULT_MAX_DEMAND, check=_positive)
    out[PROCESSOR_KEY] = ProcessorConfig(
        concurrency=p.get("concurrency", int, 2, check=_positive),
        max_demand=max_demand,
        min_demand=p.get("min_demand", int, max_demand // 2, check=lambda v: None if
                         0 <= v < max_demand else f"must be 0 or more and below max_demand "
                         f"({max_demand})"),
        partition_by=p.get("partition_by", str),
        heartbeat_timeout=_optional_duration(p, "heartbeat_timeout", 30.0),
        memory_limit=_size(p, "memory_limit"),
        max_crashes=p.get("max_crashes", int, DEFAULT_MAX_CRASHES, check=_non_negative),
        message_timeout=_optional_duration(p, "message_timeout", None))
    p.done()
    t.done()
    return out


def _batchers(t: _Table) -> dict[str, BatcherConfig]:
    out = {}
    for key in t.raw:
        if not _NAME.match(key) or "." in key:
            raise ConfigError(f"{t.key(key)}: batcher keys are letters, digits, '_' and '-'")
        b = t.table(key)
        # a count (100) or a size ("1 MiB"): the type says which
        batch_bytes = isinstance(b.get("batch_size", (int, str)), str)
        size = _size(b, "batch_size") or 100
        out[key] = BatcherConfig(
            batch_size=size, batch_bytes=batch_bytes,
            batch_timeout=b.get("batch_timeout", float, 1.0, check=_positive),
            concurrency=b.get("concurrency", int, 1, check=_positive),
            max_demand=b.get("max_demand", int, None, check=_positive),
            upstream_demand=b.get("upstream_demand", int, max(1000, 2 * size if not
                                  batch_bytes else 1000), check=_positive),
            partition_by=b.get("partition_by", str),
            heartbeat_timeout=_optional_duration(b, "heartbeat_timeout", None),
            memory_limit=_size(b, "memory_limit"))
        b.done()
    t.done()
    return out


def _spark(t: _Table) -> SparkConfig:
    partition_by = t.get("partition_by", list, [])
    if not all(isinstance(c, str) for c in partition_by):
        raise ConfigError(f"{t.key('partition_by')}: must be an array of column names")
    token_file = t.get("token_file", str, "")
    out = SparkConfig(
        master=t.get("master", str, "local[2]"),
        remote=t.get("remote", str, "", check=lambda v: None if not v or
                     v.startswith("sc://") else "must be an sc://host:port URL"),
        token_env=t.get("token_env", str, ""),
        token_file=os.path.abspath(token_file) if token_file else "",
        output=_output(t),
        table=t.get("table", str, "", check=_table_check),
        format=t.get("format", str, "parquet", check=_one_of(SPARK_FORMATS)),
        partition_by=tuple(partition_by),
        schema=_ddl(t),
        evolve=str(t.raw.get("schema", "")).strip().lower() == "evolve",
        port=t.get("port", int, 0, check=lambda v: None if 0 <= v < 65536 else
                   "must be a TCP port, or 0 to pick a free one"),
        driver_memory=t.get("driver_memory", str, "1g", check=_driver_memory),
        conf=_spark_conf(t),
        write_retry_seconds=t.get("write_retry_seconds", float, 60.0, check=_non_negative),
        write_timeout=t.get("write_timeout", float, 600.0, check=_positive),
        # group commit (stages/spark/spark_commit.py): one Spark job per this many rows, or per
        # this many seconds of the oldest waiting batch, whichever comes first
        commit_rows=t.get("commit_rows", int, SPARK_COMMIT_ROWS, check=_positive),
        commit_interval=t.get("commit_interval", float, SPARK_COMMIT_INTERVAL,
                              check=_positive),
        staging=_staging(t.get("staging", str, "")),
        exactly_once=t.get("exactly_once", bool, True),
        **_spark_cluster(t))
    t.done()
    if out.conf and out.remote:
        raise ConfigError("spark.conf: sets the local Spark server's properties; with "
                          "spark.remote there is none (configure the remote server itself)")
    return out


#: Spark refuses a driver heap under 450 MiB ("System memory ... must be at least
#: 471859200") and a JVM given a few MiB dies before it can say why: refused at check
MIN_DRIVER_MEMORY = 512 * 2**20
_JVM_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def _driver_memory(value: str) -> str | None:
    m = re.fullmatch(r"(\d+)([kmgt]?)", value.strip().lower())
    if m is None:
        return "must be a JVM heap size such as '1g' or '768m'"
    if int(m[1]) * _JVM_UNITS[m[2]] < MIN_DRIVER_MEMORY:
        return ("below the 512m Spark needs (it refuses a driver heap under 450 MiB, and a "
                "JVM given a few MiB dies at start without saying why)")
    return None


_TABLE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*\.)?[A-Za-z_][A-Za-z0-9_{}]*$")


def _table_check(v: str) -> str | None:
    return None if _TABLE.match(v) and v.count("{") == v.count("{batcher}") else \
        "must be a table name, 'name' or 'db.name' ('{batcher}' in it: one table per batcher)"


def _ddl(t: _Table) -> str:
    """``schema``: a DDL, or ``"fixed"`` (the default: the first batch, or the dataset
    already there, fixes the columns) or ``"evolve"`` (new fields become new columns)."""
    value = t.get("schema", str, "")
    return "" if value.strip().lower() in ("", "fixed", "evolve") else value


def _spark_cluster(t: _Table) -> dict:
    """What reaching a remote Spark takes beyond its address: TLS (``use_ssl``, a PEM
    ``ca_file``) and how long a connection may take (``connect_timeout``)."""
    ca_file = t.get("ca_file", str, "")
    out = {"use_ssl": t.get("use_ssl", bool, False),
           "ca_file": os.path.abspath(ca_file) if ca_file else "",
           "connect_timeout": t.get("connect_timeout", float, 2.0, check=_positive)}
    if (out["use_ssl"] or ca_file) and not t.raw.get("remote"):
        raise ConfigError(f"{t.key('use_ssl' if out['use_ssl'] else 'ca_file')}: TLS is for "
                          f"a remote Spark (spark.remote); the daemon's own server is local")
    if ca_file:
        try:
            pem = open(out["ca_file"], "rb").read()
        except OSError as exc:
            raise ConfigError(f"{t.key('ca_file')}: cannot read {out['ca_file']}: "
                              f"{exc.strerror}") from None
        if b"-----BEGIN CERTIFICATE-----" not in pem:
            raise ConfigError(f"{t.key('ca_file')}: {out['ca_file']} holds no PEM "
                              f"certificate")
    return out


def _output(t: _Table) -> str:
    """``output``: required unless the rows go to a ``table`` of Spark's catalog."""
    raw = t.get("output", str, "", required="table" not in t.raw)
    return os.path.abspath(raw) if raw else ""


def _staging(value: str) -> str:
    """``staging``: a path (made absolute: Spark's working directory is not ours) or a
    URI pyarrow and Spark both open (``hdfs://…``); empty: under the state dir."""
    return value if not value or "://" in value else os.path.abspath(value)


def _spark_conf(t: _Table) -> dict[str, str]:
    """``conf``: Spark properties for the local server, as ``--conf key=value``.

    TOML reads an unquoted ``spark.sql.shuffle.partitions = 4`` under ``[spark.conf]`` as
    nested tables: they are flattened back into the dotted name, so both spellings work.
    Values are strings, numbers or booleans (Spark reads them all as text).
    """
    raw = t.get("conf", dict, {})
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        key = f"{t.key('conf')}.{prefix}"
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
            return
        if not prefix.startswith("spark."):
            raise ConfigError(f"{key}: not a Spark property (they start with 'spark.')")
        if prefix in SPARK_OWNED_CONF:
            raise ConfigError(f"{key}: set by offbroadway itself ({SPARK_OWNED_CONF[prefix]})")
        if isinstance(value, bool):
            out[prefix] = "true" if value else "false"
        elif isinstance(value, (str, int, float)):
            out[prefix] = str(value)
        else:
            raise ConfigError(f"{key}: expected a string, number or boolean, got "
                              f"{type(value).__name__}")

    for k, v in raw.items():
        walk(k, v)
    return out


def _metrics(t: _Table) -> MetricsConfig:
    listen = t.get("listen", str, "127.0.0.1:9464")
    if listen:
        host, sep, port = listen.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ConfigError(f"{t.key('listen')}: must be 'host:port' or '' to turn metrics "
                              f"off (got {listen!r})")
    t.done()
    return MetricsConfig(listen=listen)


def _runtime(t: _Table) -> RuntimeConfig:
    rdir = os.path.abspath(t.get("dir", str, "var/run"))
    state = os.path.abspath(t.get("state_dir", str, os.path.join(os.path.dirname(rdir),
                                                                 "state")))
    out = RuntimeConfig(
        dir=rdir, state_dir=state,
        log_level=t.get("log_level", str, "info", check=_one_of(LOG_LEVELS)),
        log_format=t.get("log_format", str, "text", check=_one_of(("text", "json"))))
    t.done()
    return out


# -- the whole file -----------------------------------------------------------------------------

def validate(raw: dict, path: str = "") -> Loaded:
    """Turn parsed TOML into a :class:`Config` or raise :class:`ConfigError`."""
    root = _Table(raw, "")
    _unknown_sections(raw)
    pipeline_table = root.table("pipeline", required=True)
    producer = _producer(root.table("producer", required=True))
    processors = _processors(root.table("processors"))
    # the pipeline's restart intensity defaults from the processors' max_crashes
    pipeline = _pipeline(pipeline_table, processors[PROCESSOR_KEY].max_crashes)
    batchers = _batchers(root.table("batchers"))
    spark = _spark(root.table("spark")) if "spark" in raw else None
    if spark is not None:
        root.seen.add("spark")
    metrics = _metrics(root.table("metrics"))
    runtime = _runtime(root.table("runtime"))
    root.done()
    if spark is not None and spark.table and len(batchers) > 1 and \
            "{batcher}" not in spark.table:
        raise ConfigError("spark.table: several batchers write several tables: put "
                          "'{batcher}' in the name (e.g. \"orders_{batcher}\")")
    if spark is not None and not batchers:
        raise ConfigError("spark: a [spark] sink needs at least one [batchers.<key>] section "
                          "(Spark writes batches)")
    config = Config(pipeline, producer, processors, batchers, spark, metrics, runtime, path)
    check_socket_paths(config)
    return Loaded(config, warnings(config))


def _unknown_sections(raw: dict) -> None:
    """A misspelt section (``[pipelin]``) is named as unknown before any required section
    is missed: "pipeline: required section" would send the user looking for the wrong
    thing."""
    unknown = sorted(k for k in raw if k not in SECTIONS)
    if not unknown:
        return
    hint = _did_you_mean(unknown[0], SECTIONS, "[{}]") or f"; sections are {', '.join(SECTIONS)}"
    also = f" (also unknown: {', '.join(unknown[1:])})" if unknown[1:] else ""
    raise ConfigError(f"{unknown[0]}: unknown key{hint}{also}")


def load_config(path: str) -> Loaded:
    with open(path, "rb") as f:
        try:
            raw = tomllib.load(f)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"not valid TOML: {exc}") from None
    return validate(raw, os.path.abspath(path))
