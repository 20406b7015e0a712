"""What a stage process is told at start: its place in the topology, as plain data.

The daemon builds one :class:`StageSpec` per stage process and hands it over in the
``OFFBROADWAY_STAGE`` environment variable (JSON).  A stage never reads the config file:
everything it needs is here, so stages know nothing of the daemon.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

STAGE_ENV = "OFFBROADWAY_STAGE"
#: the one processor key (``[processors.default]``; Broadway allows only ``:default``): in
#: the config, the processors' stage ids and the ``processor`` argument of handle_message
PROCESSOR_KEY = "default"


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
    # committer: the Spark sink settings; batch processor: {"partition_by": [...]} when
    # its batches go to Spark, or None (handle_batch is the sink)
    spark: dict | None = None
    # batch processor: the stage id of its batcher's committer (Spark only)
    committer: str = ""
    # processor: seconds one callback call may run before it fails its message (None: no
    # bound; see :mod:`.liveness`)
    message_timeout: float | None = None

    def to_env(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_env(cls, environ: os._Environ | dict | None = None) -> StageSpec:
        raw: dict[str, Any] = json.loads((environ or os.environ)[STAGE_ENV])
        for key in ("upstream", "producers", "batchers"):
            raw[key] = tuple(raw.get(key, ()))
        return cls(**raw)

    def socket_path(self, stage_id: str | None = None) -> str:
        return endpoint(self.runtime_dir, stage_id or self.id)


def endpoint(runtime_dir: str, name: str) -> str:
    """The ``ipc://`` address a stage (or the daemon's hub) binds."""
    return f"ipc://{runtime_dir}/{name}.sock"


HUB = "hub"
