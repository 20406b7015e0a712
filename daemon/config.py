"""The pipeline config: TOML in, a validated, typed :class:`Config` out.

Validation is a pure function of the parsed TOML (no processes, no imports of user code
except by :func:`check_handler`), so ``offbroadway check`` and ``offbroadway run`` agree and
tests need nothing but a dict.  Every error names the dotted key it is about (unknown keys
too: a typo such as ``batch_sise`` must not silently fall back to a default), and the CLI
exits 2 on them.  Warnings are consequences the user may accept (a pitfall such as a
prefetch too small for the processors) and are printed, never fatal.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any, Callable

from offbroadway.stages.redact import mask_url

PROCESSOR_KEY = "default"
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
#: Group commit defaults (kept in step with stages/spark_commit.py, which the daemon does
#: not import: it pulls in pyarrow).  A Spark job costs ~100-270 ms whatever its size
#: (bench/spark_sink.py); at 50,000 rows that is a fraction of the job.
SPARK_COMMIT_ROWS = 50_000
SPARK_COMMIT_INTERVAL = 1.0


class ConfigError(ValueError):
    """A config that cannot run; the message starts with the dotted key at fault."""


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


@dataclass(frozen=True)
class Config:
    pipeline: PipelineConfig
    producer: ProducerConfig
    processors: dict[str, ProcessorConfig]
    batchers: dict[str, BatcherConfig]
    spark: dict | None
    metrics: MetricsConfig
    runtime: RuntimeConfig
    path: str = ""


@dataclass(frozen=True)
class Loaded:
    config: Config
    warnings: list[str]


# -- reading one table ------------------------------------------------------------------------

def _shown(value: Any) -> Any:
    """A rejected value as an error may show it: a URL without its password or token."""
    return mask_url(value) if isinstance(value, str) and "://" in value else value


class _Table:
    """One TOML table being read: typed lookups that name the key, and unknown-key checks."""

    def __init__(self, raw: Any, where: str) -> None:
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: must be a table, not {type(raw).__name__}")
        self.raw = raw
        self.where = where
        self.seen: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def get(self, name: str, types: type | tuple[type, ...], default: Any = None, *,
            required: bool = False, check: Callable[[Any], str | None] | None = None) -> Any:
        self.seen.add(name)
        if name not in self.raw:
            if required:
                raise ConfigError(f"{self.key(name)}: required")
            return default
        value = self.raw[name]
        # bool is an int in Python; a TOML `true` is never a count or a duration
        if isinstance(value, bool) and bool not in _as_tuple(types):
            raise ConfigError(f"{self.key(name)}: expected {_type_names(types)}, got a boolean")
        accepted = _as_tuple(types)
        if float in accepted and int not in accepted:
            accepted = (*accepted, int)       # a TOML `30` is a fine duration
        if not isinstance(value, accepted):
            raise ConfigError(f"{self.key(name)}: expected {_type_names(types)}, "
                              f"got {type(value).__name__} {_shown(value)!r}")
        if isinstance(value, int) and float in _as_tuple(types) and int not in _as_tuple(types):
            value = float(value)
        if check is not None:
            problem = check(value)
            if problem:
                raise ConfigError(f"{self.key(name)}: {problem} (got {_shown(value)!r})")
        return value

    def table(self, name: str, required: bool = False) -> _Table:
        self.seen.add(name)
        if name not in self.raw:
            if required:
                raise ConfigError(f"{self.key(name)}: required section")
            return _Table({}, self.key(name))
        return _Table(self.raw[name], self.key(name))

    def done(self) -> None:
        unknown = sorted(set(self.raw) - self.seen)
        if unknown:
            also = f" (also unknown: {', '.join(unknown[1:])})" if unknown[1:] else ""
            raise ConfigError(f"{self.key(unknown[0])}: unknown key{also}")


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _type_names(types: type | tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "a boolean",
             list: "an array", dict: "a table"}
    return " or ".join(names.get(t, t.__name__) for t in _as_tuple(types))


def _positive(v: float) -> str | None:
    return None if v > 0 else "must be greater than 0"


def _non_negative(v: float) -> str | None:
    return None if v >= 0 else "must be 0 or more"


def _one_of(choices: tuple[str, ...]) -> Callable[[str], str | None]:
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}"


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
          "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4,
          "tb": 1000**4, "tib": 1024**4}


def parse_size(value: int | str) -> int:
    """``1048576``, ``"1MiB"``, ``"512MB"`` → bytes."""
    if isinstance(value, int):
        return value
    m = _SIZE.match(value)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"not a size: {value!r} (use bytes, or e.g. '512MiB', '1GB')")
    return int(float(m.group(1)) * _UNITS[unit])


def _size(t: _Table, name: str) -> int | None:
    value = t.get(name, (int, str))
    if value is None:
        return None
    try:
        n = parse_size(value)
    except ValueError as exc:
        raise ConfigError(f"{t.key(name)}: {exc}") from None
    if n <= 0:
        raise ConfigError(f"{t.key(name)}: must be greater than 0 (got {value!r})")
    return n


_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_HANDLER = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _name_check(v: str) -> str | None:
    return None if _NAME.match(v) else "must be 1-64 letters, digits, '_', '.', '-'"


def _source_check(v: str) -> str | None:
    """A built-in source's name, or ``package.module:ClassName`` for one of your own (it
    is imported and checked by :func:`check_source`, not here: validation imports no user
    code)."""
    if v in SOURCES or _HANDLER.match(v):
        return None
    return (f"must be one of {', '.join(SOURCES)}, or 'package.module:ClassName' for your "
            f"own source")


def _handler_check(v: str) -> str | None:
    return None if _HANDLER.match(v) else "must be 'package.module:ClassName'"


def _optional_duration(t: _Table, name: str, default: float | None) -> float | None:
    """A timeout where 0 means "off"."""
    value = t.get(name, (int, float), default, check=_non_negative)
    return float(value) if value else None


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
        max_crashes=p.get("max_crashes", int, DEFAULT_MAX_CRASHES, check=_non_negative))
    p.done()
    t.done()
    return out


def _batchers(t: _Table) -> dict[str, BatcherConfig]:
    out = {}
    for key in t.raw:
        if not _NAME.match(key) or "." in key:
            raise ConfigError(f"{t.key(key)}: batcher keys are letters, digits, '_' and '-'")
        b = t.table(key)
        size = b.get("batch_size", (int, str), 100)
        batch_bytes = isinstance(size, str)
        try:
            size = parse_size(size)
        except ValueError as exc:
            raise ConfigError(f"{b.key('batch_size')}: {exc}") from None
        if size <= 0:
            raise ConfigError(f"{b.key('batch_size')}: must be greater than 0 (got {size})")
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


def _spark(t: _Table) -> dict:
    out = {
        "master": t.get("master", str, "local[2]"),
        "remote": t.get("remote", str, "", check=lambda v: None if not v or
                        v.startswith("sc://") else "must be an sc://host:port URL"),
        "token_env": t.get("token_env", str, ""),
        "token_file": t.get("token_file", str, ""),
        "output": t.get("output", str, required=True),
        "format": t.get("format", str, "parquet", check=_one_of(SPARK_FORMATS)),
        "partition_by": t.get("partition_by", list, []),
        "schema": t.get("schema", str, ""),
        "port": t.get("port", int, 0, check=lambda v: None if 0 <= v < 65536 else
                      "must be a TCP port, or 0 to pick a free one"),
        "driver_memory": t.get("driver_memory", str, "1g"),
        "write_retry_seconds": t.get("write_retry_seconds", float, 60.0, check=_non_negative),
        "write_timeout": t.get("write_timeout", float, 600.0, check=_positive),
        # group commit (stages/spark_commit.py): one Spark job per this many rows, or per
        # this many seconds of the oldest waiting batch, whichever comes first
        "commit_rows": t.get("commit_rows", int, SPARK_COMMIT_ROWS, check=_positive),
        "commit_interval": t.get("commit_interval", float, SPARK_COMMIT_INTERVAL,
                                 check=_positive),
    }
    if not all(isinstance(c, str) for c in out["partition_by"]):
        raise ConfigError(f"{t.key('partition_by')}: must be an array of column names")
    t.done()
    out["output"] = os.path.abspath(out["output"])
    if out["token_file"]:
        out["token_file"] = os.path.abspath(out["token_file"])
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
    if spark is not None and not batchers:
        raise ConfigError("spark: a [spark] sink needs at least one [batchers.<key>] section "
                          "(Spark writes batches)")
    config = Config(pipeline, producer, processors, batchers, spark, metrics, runtime, path)
    _check_socket_paths(config)
    return Loaded(config, warnings(config))


def _unknown_sections(raw: dict) -> None:
    """A misspelt section (``[pipelin]``) is named as unknown before any required section
    is missed: "pipeline: required section" would send the user looking for the wrong
    thing."""
    import difflib

    unknown = sorted(k for k in raw if k not in SECTIONS)
    if not unknown:
        return
    close = difflib.get_close_matches(unknown[0], SECTIONS, n=1)
    hint = f"; did you mean [{close[0]}]?" if close else f"; sections are {', '.join(SECTIONS)}"
    also = f" (also unknown: {', '.join(unknown[1:])})" if unknown[1:] else ""
    raise ConfigError(f"{unknown[0]}: unknown key{hint}{also}")


def socket_paths(config: Config) -> dict[str, str]:
    """Every unix socket the daemon and its stages bind → the config key that shapes its
    name (``runtime.dir`` for the fixed names, ``batchers.<key>`` for a batcher's stages).

    Computed from the topology the daemon builds, so a new stage or a longer name can never
    outgrow a length assumed here.
    """
    from offbroadway.stages.spec import HUB

    from .control import CONTROL_SOCKET
    from .topology import build

    topo = build(config)
    rdir = config.runtime.dir
    out = {os.path.join(rdir, CONTROL_SOCKET): "runtime.dir",
           os.path.join(rdir, f"{HUB}.sock"): "runtime.dir"}
    owner = {}
    for key in config.batchers:
        owner[f"batcher_{key}"] = f"batchers.{key}"
        for i in range(config.batchers[key].concurrency):
            owner[f"batch_processor_{key}_{i}"] = f"batchers.{key}"
    for sid in topo.stages:
        out[os.path.join(rdir, f"{sid}.sock")] = owner.get(sid, "runtime.dir")
    return out


def _check_socket_paths(config: Config) -> None:
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
    if config.spark is not None and config.spark["commit_rows"] < 5000:
        out.append(
            f"spark.commit_rows: {config.spark['commit_rows']} rows per Spark job spends most "
            f"of the time in Spark's fixed per-job cost (0.1-0.3 s); 10000 or more amortizes it")
    window_option = {"rabbitmq": "prefetch_count", "nats": "prefetch"}.get(
        config.producer.source)
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


def load_config(path: str) -> Loaded:
    with open(path, "rb") as f:
        try:
            raw = tomllib.load(f)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"not valid TOML: {exc}") from None
    return validate(raw, os.path.abspath(path))


def check_source(config: Config) -> list[str]:
    """Let the source validate its options, so ``check`` names ``producer.options.<key>``,
    and check what it can of them without connecting (:meth:`Source.preflight`).

    Returns the source's notes on what only a live connection can tell.
    """
    from offbroadway.stages.sources import UnknownSourceError, get_source
    from offbroadway.stages.sources.base import SourceOptionError

    name = config.producer.source
    try:
        cls = get_source(name)
    except (ImportError, UnknownSourceError) as exc:
        raise ConfigError(f"producer.source: {exc}") from None
    try:
        cls.validate_options(config.producer.options)
        if name not in SOURCES:
            _construct_source(cls, config)
        return list(cls.preflight(config.producer.options))
    except ConfigError:
        raise
    except ValueError as exc:   # SourceOptionError names the option; others may not
        option = exc.option if isinstance(exc, SourceOptionError) else None
        key = f"producer.options.{option}" if option else "producer.options"
        raise ConfigError(f"{key}: {exc}") from None
    except ImportError as exc:
        raise ConfigError(f"producer.source: {exc}") from None
    except Exception as exc:    # a user's source whose checks themselves fail
        raise ConfigError(f"producer.source: checking the options of {name} raised "
                          f"{type(exc).__name__}: {exc}") from None


def _construct_source(cls: type, config: Config) -> None:
    """Build one instance of a user's source the way a producer does (the Source API says a
    constructor only validates and stores), so a constructor that cannot be called with the
    producer's arguments, or that raises, is found by ``check``, not by a crash loop."""
    from offbroadway.stages.sources.base import SourceOptionError

    try:
        cls(dict(config.producer.options), pipeline=config.pipeline.name, producer_index=0,
            producer_count=config.producer.concurrency, state_dir=config.runtime.state_dir)
    except SourceOptionError:
        raise
    except Exception as exc:
        raise ConfigError(f"producer.source: {config.producer.source}(options, ...) raised "
                          f"{type(exc).__name__}: {exc}") from None


def _check_dir(key: str, path: str) -> None:
    """``path`` is a directory we can use, or can be created as one (nothing is created)."""
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        what = "is a file, not a directory" if probe == path else \
            f"cannot be created: {probe!r} is a file, not a directory"
        raise ConfigError(f"{key}: {path!r} {what}")
    if not os.access(probe, os.W_OK | os.X_OK):
        what = "is not writable" if probe == path else \
            f"cannot be created: no write permission on {probe!r}"
        raise ConfigError(f"{key}: {path!r} {what} (uid {os.getuid()})")


def _module_available(name: str) -> bool:
    import importlib.util
    import sys

    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def find_java() -> str | None:
    """The ``java`` the local Spark server will exec (``$JAVA_HOME/bin/java``, else PATH)."""
    import shutil

    home = os.environ.get("JAVA_HOME")
    if home:
        java = os.path.join(home, "bin", "java")
        return java if os.access(java, os.X_OK) else None
    return shutil.which("java")


def check_spark(config: Config) -> list[str]:
    """pyspark importable, and Java for a local server: the batch processors and the Spark
    child fail at start without them."""
    if config.spark is None:
        return []
    if not _module_available("pyspark"):
        raise ConfigError("spark: pyspark is not installed (pip install 'offbroadway[spark]')")
    if config.spark.get("remote"):
        return [f"Spark Connect at {mask_url(config.spark['remote'])} is not contacted by "
                f"check: whether it is reachable shows only when the daemon runs"]
    if find_java() is None:
        where = (f"JAVA_HOME={os.environ['JAVA_HOME']} has no bin/java"
                 if os.environ.get("JAVA_HOME") else "no java on PATH and JAVA_HOME is unset")
        raise ConfigError(f"spark: the local Spark server needs Java 17 or later ({where})")
    return []


def _check_private(key: str, path: str) -> None:
    """An existing runtime dir must be ours and closed to others: the sockets that steer
    the daemon live there (the daemon refuses it at start too, ``app.prepare_private_dir``)."""
    import stat

    if not os.path.isdir(path):
        return
    st = os.stat(path)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(f"{key}: {path!r} is writable by group/others (mode "
                          f"{stat.S_IMODE(st.st_mode):o}); refusing to start: chmod 700 it")
    if st.st_uid != os.getuid():
        raise ConfigError(f"{key}: {path!r} belongs to uid {st.st_uid}, not {os.getuid()}")


def preflight(config: Config) -> list[str]:
    """Everything ``run`` would refuse at start that can be known without starting it,
    in the order ``run`` meets it: ``check`` runs this, and so does ``run`` before it
    creates anything.  Returns notes on what only a running daemon can tell."""
    _check_dir("runtime.dir", config.runtime.dir)
    _check_private("runtime.dir", config.runtime.dir)
    _check_dir("runtime.state_dir", config.runtime.state_dir)
    notes = check_source(config)
    _check_spool_not_in_its_state(config)
    check_handler(config)
    notes += check_spark(config)
    return notes


def _check_spool_not_in_its_state(config: Config) -> None:
    """A spool reading ``<state_dir>/spool`` would read its own ``dead-letter.jsonl`` (and
    ack records) back as input: every failed line failed again, forever."""
    if config.producer.source != "spool" or not isinstance(config.producer.options.get("path"),
                                                           str):
        return
    path = os.path.abspath(config.producer.options["path"])
    own = os.path.join(os.path.abspath(config.runtime.state_dir), "spool")
    if path == own:
        raise ConfigError(f"producer.options.path: {path!r} is where the spool keeps its own "
                          f"records and dead-letter.jsonl (runtime.state_dir + '/spool'); "
                          f"use another directory for the input")


def check_handler(config: Config) -> None:
    """Import ``pipeline.handler`` the way a stage will, so ``check`` catches a typo."""
    import importlib

    ref = config.pipeline.handler
    module_name, _, attr = ref.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as exc:
        raise ConfigError(f"pipeline.handler: cannot load {ref!r}: "
                          f"{type(exc).__name__}: {exc}") from None
    if not callable(getattr(obj, "handle_message", None)):
        raise ConfigError(f"pipeline.handler: {ref!r} has no handle_message")
    if isinstance(obj, type):
        # every stage makes one (offbroadway.stages.stage.load_handler): an __init__ that
        # raises would crash them all in a restart loop
        try:
            obj()
        except (Exception, SystemExit) as exc:    # sys.exit() in __init__ too
            raise ConfigError(f"pipeline.handler: {ref}() raised {type(exc).__name__}: "
                              f"{exc}") from None
