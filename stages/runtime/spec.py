"""What a stage process is told at start: its place in the topology, as plain data.

The daemon builds one :class:`StageSpec` per stage process and hands it over in the
``OFFBROADWAY_STAGE`` environment variable (JSON).  A stage never reads the config file:
everything it needs is here, so stages know nothing of the daemon.

A stage spec's Spark part depends on the role (:data:`SparkSpec`, a tagged union decoded
once with the spec): a committer's is :class:`CommitterSpark` (its group commit, its
journal and its sink's :class:`SinkSettings`), a batch processor's :class:`HandoffSpark`
(what its conversion to rows needs).  Both cross the process boundary inside the spec, as
JSON: plain values, never a token.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

#: The group commit's defaults, the one definition (daemon/config/records.py names them for
#: ``[spark]``; the committer's rule, stages/spark/spark_commit.py, uses them), chosen from
#: the end-to-end measurements in docs/benchmarks.md ("Larger commits"): jobs of 200,000
#: rows or 4 s cost the JVM 7.5 us a row against 19.7 at 50,000 or 1 s; a lone batch waits
#: at most the interval.
DEFAULT_ROWS = 200_000
DEFAULT_INTERVAL = 4.0


def journal_file(folder: str, pipeline: str, batcher: str) -> str:
    """A committer's journal of commit stamps (stages/spark/spark_once.py): one file per
    pipeline and batcher in ``folder`` (``<state dir>/spark-commits`` unless the spec says);
    the committer writes it, the daemon marks it clean after a clean stop."""
    return os.path.join(folder, f"{pipeline}.{batcher}")


#: the journals' folder under the state dir, unless a spec's ``journal`` says otherwise
JOURNAL_FOLDER = "spark-commits"

STAGE_ENV = "OFFBROADWAY_STAGE"
#: the one processor key (``[processors.default]``; Broadway allows only ``:default``): in
#: the config, the processors' stage ids and the ``processor`` argument of handle_message
PROCESSOR_KEY = "default"


class SinkSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Where and how a committer's Spark sink writes: the keyword arguments of
    :class:`~offbroadway.stages.spark.spark_sink.SparkSink` less the ones the committer
    adds itself (its id, its callbacks, its session id).  Token-free: a remote's token is
    named (``token_env``, ``token_file``), never carried.  Crosses the process boundary in
    the committer's :class:`StageSpec`."""

    output: str = ""
    format: str = "parquet"
    table: str | None = None
    partition_by: tuple[str, ...] = ()
    schema: str | None = None
    evolve: bool = False
    #: the staging area (None: the committer's default under its state dir)
    staging: str | None = None
    write_retry_seconds: float = 60.0
    write_timeout: float = 600.0
    connect_timeout: float = 2.0
    remote: str | None = None
    token_env: str | None = None
    token_file: str | None = None
    use_ssl: bool = False
    ca_file: str | None = None


class CommitterSpark(msgspec.Struct, tag="committer", frozen=True, kw_only=True):
    """A committer's settings: its group commit, its exactly-once books and its sink.
    Crosses the process boundary in the committer's :class:`StageSpec` (JSON)."""

    sink: SinkSettings = SinkSettings()
    commit_rows: int = DEFAULT_ROWS
    commit_interval: float = DEFAULT_INTERVAL
    #: ``[spark] exactly_once = false``: no journal of commit stamps, no ids in doubt
    exactly_once: bool = True
    #: the folder of the committers' journals (None: ``<state dir>/spark-commits``)
    journal: str | None = None
    #: the most batches one batch processor may hold unacked (its demand): the files of
    #: that many committed batches are kept per batch processor
    peer_batches: int = 0

    #: the keys of the daemon's flat settings that are the committer's, not the sink's
    OWN = ("commit_rows", "commit_interval", "exactly_once", "journal", "peer_batches")

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> CommitterSpark:
        """The record of the daemon's flat, JSON-able settings (``daemon/spark.py``'s
        ``sink_settings``): the committer's keys, the rest the sink's.  A key given as
        None takes its default."""
        own = {k: settings[k] for k in cls.OWN if settings.get(k) is not None}
        sink = {k: v for k, v in settings.items() if k not in cls.OWN}
        return msgspec.convert({**own, "sink": sink}, cls)


class HandoffSpark(msgspec.Struct, tag="batch_processor", frozen=True, kw_only=True):
    """A batch processor's Spark settings: what converting its batches to rows needs.
    Crosses the process boundary in the batch processor's :class:`StageSpec` (JSON)."""

    partition_by: tuple[str, ...] = ()
    #: ``[spark] schema = "evolve"``: new fields widen the schema (spark_evolve)
    evolve: bool = False


#: a stage spec's Spark part, by role (None: no Spark)
SparkSpec = CommitterSpark | HandoffSpark


@dataclass(frozen=True)
class StageSpec:
    id: str
    role: str                      # producer | processor | batcher | batch_processor | committer
    pipeline: str
    runtime_dir: str
    handler: str = ""              # "package.module:Class"
    context: dict = field(default_factory=dict)
    index: int = 0
    # upstream stage ids this stage subscribes to, in order (index = producer index)
    upstream: tuple[str, ...] = ()
    # producer ids, for stages that ack (processors, batch processors)
    producers: tuple[str, ...] = ()
    max_demand: int = 1000
    min_demand: int = 500
    # processors: the batcher keys they partition to (empty: processors ack themselves)
    batchers: tuple[str, ...] = ()
    # producer
    source: str = ""
    source_options: dict = field(default_factory=dict)
    producer_count: int = 1
    state_dir: str = ""
    dispatcher: str = "spread"
    buffer_size: int = 10_000
    # producer: crashes blamed on one message before it is failed as poison (0: never)
    max_crashes: int = 0
    # the handler method that routes messages to consumer partitions, if any
    partition_by: str | None = None
    consumer_count: int = 0
    # batcher / batch processor
    batcher: str = ""
    batch_size: int = 100
    batch_bytes: bool = False
    batch_timeout: float = 1.0
    # committer: its CommitterSpark; batch processor: its HandoffSpark when its batches go
    # to Spark, or None (handle_batch is the sink)
    spark: CommitterSpark | HandoffSpark | None = None
    # batch processor: the stage id of its batcher's committer (Spark only)
    committer: str = ""
    # processor: seconds one callback call may run before it fails its message (None: no
    # bound; see :mod:`.liveness`)
    message_timeout: float | None = None

    def to_env(self) -> str:
        return msgspec.json.encode(self).decode()

    @classmethod
    def from_env(cls, environ: os._Environ | dict | None = None) -> StageSpec:
        """The spec as the daemon encoded it, decoded once, Spark part included."""
        return msgspec.json.decode((environ or os.environ)[STAGE_ENV], type=cls)

    def socket_path(self, stage_id: str | None = None) -> str:
        return endpoint(self.runtime_dir, stage_id or self.id)


def endpoint(runtime_dir: str, name: str) -> str:
    """The ``ipc://`` address a stage (or the daemon's hub) binds."""
    return f"ipc://{runtime_dir}/{name}.sock"


HUB = "hub"


def hub_identity(stage_id: str, pid: int) -> bytes:
    """A stage incarnation's routing id at the daemon's hub: its stage id and its pid.

    Not the stage id alone: a ROUTER gives a reconnecting routing id to the new
    connection and renames the old one, so a report the old incarnation sent just before
    it exited (its last figures), still unread when its successor connects, would reach
    the daemon under a name of libzmq's making and be lost from the books."""
    return f"{stage_id}@{pid}".encode()


def hub_stage(identity: bytes) -> str:
    """The stage id in a :func:`hub_identity` (a name libzmq made up has none: "")."""
    stage, at, pid = identity.decode(errors="replace").rpartition("@")
    return stage if at and pid.isdigit() else ""
