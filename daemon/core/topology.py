"""The pipeline's supervision tree, built from the config in one place (Broadway.Topology).

Everything the supervisors and stages do follows from the tree this module returns: ids,
order, strategies, intensities, and each stage's :class:`StageSpec`.  The shape is
Broadway's (ARCHITECTURE §2)::

    PipelineSupervisor (rest_for_one)
    ├── spark                              local Spark Connect server, if any
    ├── ProducerSupervisor (one_for_one)   producer_0 …
    ├── ProcessorSupervisor (one_for_all, max_restarts 0)   processor_default_0 …
    ├── BatchersSupervisor (one_for_one)
    │   └── BatcherSupervisor_<key> (rest_for_one)
    │       ├── committer_<key>                with [spark]: the dataset's only writer
    │       ├── batcher_<key>
    │       └── BatchProcessorSupervisor_<key> (one_for_all, max_restarts 0)
    │           └── batch_processor_<key>_0 …
    └── terminator                         lives in the daemon process (pid null)

``max_restarts = 0`` under processors and batch processors is Broadway's choice: callbacks
fail messages, not processes, so a dead processor means something unforeseen, and the
whole downstream restarts from a clean state while producers keep their sources open.

The committer comes first under its batcher's ``rest_for_one``: the batch processors hold
the messages of the batches it is committing, so when it dies they restart too (their
unacked messages are delivered again), while a batch processor's death leaves it alone
(it forgets that processor's batches no job holds yet when the new incarnation says
hello).  Behind ``spark`` in the pipeline's ``rest_for_one``, a restarted Spark server
restarts every committer with the new server's address and token.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Callable

import msgspec
from offbroadway.daemon.config.names import (
    BATCH_PROCESSOR,
    BATCHER,
    COMMITTER,
    PROCESSOR,
    PRODUCER,
    batch_processor_ids,
    batcher_id,
    committer_id,
    processor_ids,
    producer_ids,
)
from offbroadway.daemon.config.records import BatcherConfig, Config, batch_demand
from offbroadway.stages.runtime.logs import FORMAT_ENV, LEVEL_ENV
from offbroadway.stages.runtime.spec import (
    PROCESSOR_KEY,
    STAGE_ENV,
    CommitterSpark,
    HandoffSpark,
    StageSpec,
)
from offbroadway.stages.sources import sized_options, window_max, window_option
from offbroadway.supervision.child import GUARD_SIGNAL
from offbroadway.supervision.spec import (
    INFINITY,
    Restart,
    Strategy,
    SupervisorSpec,
    WorkerSpec,
)

WORKER_ARGV = (sys.executable, "-m", "offbroadway.stages.worker")
#: Broadway's intensity for the supervisors the config does not set (its supervisors are
#: started with max_restarts 3 in max_seconds 5), said here: the supervision library
#: defaults to OTP's 1 in 5 s
BROADWAY_MAX_RESTARTS, BROADWAY_MAX_SECONDS = 3, 5.0


@dataclass
class Topology:
    """The tree plus the indexes the daemon needs to steer it.

    Who consumes whom is each stage's :attr:`StageSpec.upstream`, and who finishes messages
    (acks them to their producers) its :attr:`StageSpec.producers`: the daemon's reactions
    and its drain ask :meth:`consumers`, :attr:`sources`, :attr:`first`, :attr:`last` and
    :meth:`is_downstream` rather than role names (Broadway's ``build_topology_details``:
    the layers are read off the wiring, once).
    """

    root: SupervisorSpec
    producers: list[str] = field(default_factory=list)
    processors: list[str] = field(default_factory=list)
    batchers: list[str] = field(default_factory=list)
    batch_processors: list[str] = field(default_factory=list)
    committers: list[str] = field(default_factory=list)
    #: batcher key -> its batch processors, in index order
    by_batcher: dict[str, list[str]] = field(default_factory=dict)
    spark: str | None = None
    roles: dict[str, str] = field(default_factory=dict)
    #: every stage's spec, in start order
    specs: dict[str, StageSpec] = field(default_factory=dict)
    #: the sources' ``"auto"`` window and the Spark group size it allows
    window: Window | None = None

    def consumers(self, sid: str) -> list[str]:
        """The stages that subscribe to stage ``sid``, in start order."""
        return [s for s, spec in self.specs.items() if sid in spec.upstream]

    def is_downstream(self, sid: str) -> bool:
        """Whether stage ``sid`` consumes from another stage: its death loses messages in
        flight (a producer's own come back from its source)."""
        spec = self.specs.get(sid)
        return spec is not None and bool(spec.upstream)

    def role_of(self, sid: str) -> str | None:
        """The role of child ``sid`` of this tree (``spark`` for the Spark server); None
        for a supervisor or an id the tree does not have (a stage a resize removed)."""
        return self.roles.get(sid)

    @property
    def last(self) -> list[str]:
        """Broadway's last layer, the stages whose ``done`` ends a drain: they ack
        messages to their producers and nothing consumes from them."""
        return [s for s, spec in self.specs.items() if spec.producers and not self.consumers(s)]

    @property
    def sources(self) -> list[str]:
        """The stages that read a source: they consume from none and are consumed."""
        return [s for s, spec in self.specs.items()
                if not spec.upstream and self.consumers(s)]

    @property
    def first(self) -> list[str]:
        """Broadway's first layer, the stages that run messages straight from the sources
        (the processors): a crash of one is blamed on what it ran (poison), and the drain
        tells them not to resubscribe to a source."""
        sources = self.sources
        return [s for s, spec in self.specs.items() if any(u in sources for u in spec.upstream)]

    @property
    def stages(self) -> list[str]:
        return (self.producers + self.processors + self.committers + self.batchers
                + self.batch_processors)


def batch_processor_demand(b: BatcherConfig, commit_rows: int | None) -> int:
    """Batches a batch processor asks its batcher for at once.

    Without Spark, or with ``max_demand`` set, :func:`batch_demand`.  With Spark a batch waits
    for its group commit before it is acked and its demand given back, so a batch
    processor must be able to hold enough batches for the committer to gather one job
    while the previous one runs: two jobs' worth of rows (``2 x commit_rows``) over all
    the batch processors of the batcher (at least :func:`batch_demand`).  Batches in bytes
    have no row count: 16.  ``commit_rows``: None without a Spark sink.
    """
    if commit_rows is None or b.max_demand is not None:
        return batch_demand(b)
    if b.batch_bytes:
        return max(batch_demand(b), 16)
    rows = 2 * commit_rows
    return max(batch_demand(b), min(1024, math.ceil(rows / (b.batch_size * b.concurrency)) + 1))


def held(config: Config, commit_rows: int | None) -> int:
    """What the stages downstream of one producer hold when every one is fed, with Spark
    groups of ``commit_rows`` (None: no Spark sink): every processor ``max_demand``
    messages, every batcher a batch in the making plus what its batch processors ask for
    (:func:`batch_processor_demand`: with Spark, two commit groups' worth, one being
    written while the next gathers).  Split over the producers, rounded up."""
    proc = config.processors[PROCESSOR_KEY]
    need = proc.concurrency * proc.max_demand + sum(
        (b.batch_size if not b.batch_bytes else b.upstream_demand)
        * (1 + b.concurrency * batch_processor_demand(b, commit_rows))
        for b in config.batchers.values())
    return max(1, math.ceil(need / config.producer.concurrency))


@dataclass(frozen=True)
class Window:
    """A broker source's ``"auto"`` window per producer, and what it costs the Spark groups.

    ``prefetch`` is what ``"auto"`` stands for; ``held`` what the pipeline would hold per
    producer at the configured ``spark.commit_rows``; ``commit_rows`` the group size the
    committers use (None without Spark); ``note`` the line saying why, when the source's
    protocol could not say ``held``; ``waits`` whether some stages will then wait for
    deliveries (a warning) rather than Spark groups being made smaller (information).
    """

    prefetch: int
    held: int
    commit_rows: int | None
    note: str | None = None
    waits: bool = False


def auto_window(config: Config) -> Window:
    """The window a broker source's prefetch must allow so the topology never starves (the
    seeds' pitfall), bounded by what the pipeline holds (:func:`held`: a window beyond it
    only parks messages in the producer, out of other consumers' reach) and by what the
    source's protocol can say (AMQP: 65535).

    When that protocol bound cuts the window below what two Spark groups of
    ``spark.commit_rows`` need, the group is made smaller instead (the largest size whose
    window fits): a group whose rows the broker cannot let out would only start at
    ``commit_interval``, with Spark idle while the rest trickles in; two smaller groups
    keep one being written while the next gathers.  An explicit window is the user's:
    nothing is lowered for it.
    """
    rows = config.spark.commit_rows if config.spark is not None else None
    full = held(config, rows)
    cap = window_max(config.producer.source)
    option = window_option(config.producer.source)
    if cap is None or full <= cap or option is None \
            or config.producer.options.get(option, "auto") != "auto":
        return Window(full, full, rows)
    producers = config.producer.concurrency
    enough = math.ceil(full * producers / cap)   # producers that would keep the full window
    said = (f"producer.options.{option} \"auto\": the pipeline holds {full:,} messages per "
            f"producer{f' with spark.commit_rows {rows:,}' if rows else ''}, above "
            f"{cap:,}, the most {config.producer.source}'s protocol can say")
    if rows is not None and held(config, 1) <= cap:
        lo, hi = 1, rows           # the largest group whose window fits under the cap
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if held(config, mid) <= cap else (lo, mid - 1)
        window = held(config, lo)
        return Window(window, full, lo, (
            f"{said}: window {window:,} per producer, and Spark commits groups of {lo:,} "
            f"rows instead of {rows:,} so one is written while the next gathers "
            f"(producer.concurrency = {enough} keeps {rows:,})"))
    return Window(cap, full, rows, (
        f"{said}: window {cap:,} per producer, so some stages will wait for deliveries "
        f"(producer.concurrency = {enough} feeds them all)"), waits=True)


def auto_prefetch(config: Config) -> int:
    """What a broker source's ``"auto"`` window stands for, per producer
    (:func:`auto_window`; the source decides what to make of it:
    :meth:`offbroadway.stages.sources.base.Source.sized_options`)."""
    return auto_window(config).prefetch


def log_env(config: Config) -> dict[str, str]:
    """What every process of the pipeline is told about logging (level and format)."""
    return {LEVEL_ENV: config.runtime.log_level, FORMAT_ENV: config.runtime.log_format}


def build(config: Config, *, stage_env: Callable[[str], dict[str, str]] | None = None,
          spark_child: WorkerSpec | None = None,
          committer_env: Callable[[], dict[str, str]] | None = None,
          spark_settings: dict | None = None, sized: bool = True) -> Topology:
    """Turn a validated config into the supervision tree.

    ``stage_env(stage_id)`` adds environment for every stage (metrics dir, log settings);
    ``spark_child`` is the local Spark server's worker spec (None: no local server);
    ``committer_env()`` is evaluated at each committer start (the Spark token of the
    current server incarnation); ``spark_settings`` (None: no Spark sink), the daemon's
    flat settings (:func:`.spark.sink_settings`), become the committers' typed
    :class:`CommitterSpark` here, once, and their batch processors' :class:`HandoffSpark`.
    ``sized=False`` leaves the source's options as configured
    (validation: only the tree's shape is wanted, and sizing imports the source).
    """
    p = config.pipeline
    rt = config.runtime
    proc = config.processors[PROCESSOR_KEY]
    topo = Topology(root=None)  # type: ignore[arg-type]
    base = dict(pipeline=p.name, runtime_dir=rt.dir, handler=p.handler, context=dict(p.context))
    extra_env = stage_env or (lambda _id: {})

    def worker(spec: StageSpec, *, heartbeat: float | None = None, memory: int | None = None,
               env_fn: Callable[[], dict[str, str]] | None = None, shutdown: float = 5.0
               ) -> WorkerSpec:
        topo.roles[spec.id] = spec.role
        topo.specs[spec.id] = spec
        payload = spec.to_env()

        def env() -> dict[str, str]:
            out = {STAGE_ENV: payload, **extra_env(spec.id)}
            if env_fn is not None:
                out.update(env_fn())
            return out

        return WorkerSpec(id=spec.id, argv=WORKER_ARGV, env=env, restart=Restart.PERMANENT,
                          shutdown=shutdown, heartbeat_timeout=heartbeat or None,
                          memory_limit=memory, meta={"role": spec.role},
                          # a handler's own subprocesses die with the daemon too
                          pdeathsig=GUARD_SIGNAL)

    batcher_keys = tuple(config.batchers)
    topo.window = auto_window(config)
    spark = CommitterSpark.from_settings(spark_settings) if spark_settings is not None \
        else None
    if spark is not None and topo.window.commit_rows is not None:
        # the group size the window can feed (the committers and their batch processors')
        spark = msgspec.structs.replace(spark, commit_rows=topo.window.commit_rows)
    source_options = dict(config.producer.options)
    if sized:
        source_options = sized_options(config.producer.source, source_options,
                                       topo.window.prefetch)
    n_producers = config.producer.concurrency
    topo.producers = producer_ids(n_producers)
    topo.processors = processor_ids(PROCESSOR_KEY, proc.concurrency)

    producers = [
        worker(StageSpec(id=pid, role=PRODUCER, index=i, source=config.producer.source,
                         source_options=source_options,
                         producer_count=n_producers, state_dir=rt.state_dir,
                         dispatcher=config.producer.dispatcher,
                         buffer_size=config.producer.buffer_size,
                         partition_by=proc.partition_by, consumer_count=proc.concurrency,
                         max_crashes=proc.max_crashes, **base))
        for i, pid in enumerate(topo.producers)]
    processors = [
        worker(StageSpec(id=cid, role=PROCESSOR, index=i, upstream=tuple(topo.producers),
                         producers=tuple(topo.producers), max_demand=proc.max_demand,
                         min_demand=proc.min_demand, batchers=batcher_keys,
                         partition_by=proc.partition_by,
                         message_timeout=proc.message_timeout, **base),
               heartbeat=proc.heartbeat_timeout, memory=proc.memory_limit)
        for i, cid in enumerate(topo.processors)]

    batcher_sups = []
    for key, b in config.batchers.items():
        bid = batcher_id(key)
        topo.batchers.append(bid)
        bp_ids = batch_processor_ids(key, b.concurrency)
        topo.batch_processors.extend(bp_ids)
        topo.by_batcher[key] = bp_ids
        committer = None
        bp_spark = None
        cid = ""
        bp_demand = batch_processor_demand(b, spark.commit_rows if spark is not None else None)
        if spark is not None:
            cid = committer_id(key)
            topo.committers.append(cid)
            bp_spark = HandoffSpark(partition_by=spark.sink.partition_by,
                                    evolve=spark.sink.evolve)
            # waits for its running job at shutdown (bounded by write_timeout); it keeps
            # the files of as many committed batches per batch processor as one may hold
            # unacked (its demand), whose ids are in doubt if it restarts
            committer = worker(StageSpec(id=cid, role=COMMITTER, batcher=key,
                                         spark=msgspec.structs.replace(
                                             spark, peer_batches=bp_demand),
                                         **base),
                               heartbeat=b.heartbeat_timeout, env_fn=committer_env,
                               shutdown=max(10.0, p.shutdown_timeout))
        batcher = worker(StageSpec(
            id=bid, role=BATCHER, upstream=tuple(topo.processors), batcher=key,
            batch_size=b.batch_size, batch_bytes=b.batch_bytes, batch_timeout=b.batch_timeout,
            max_demand=b.upstream_demand, min_demand=b.upstream_demand // 2,
            consumer_count=b.concurrency, partition_by=b.partition_by, **base),
            heartbeat=b.heartbeat_timeout, memory=b.memory_limit)
        bps = [worker(StageSpec(
            id=bp, role=BATCH_PROCESSOR, index=i, upstream=(bid,),
            producers=tuple(topo.producers), batcher=key, max_demand=bp_demand,
            min_demand=bp_demand // 2, partition_by=b.partition_by,
            spark=bp_spark, committer=cid, **base),
            heartbeat=b.heartbeat_timeout, memory=b.memory_limit,
            shutdown=max(10.0, p.shutdown_timeout))
            for i, bp in enumerate(bp_ids)]
        batcher_sups.append(SupervisorSpec(
            id=f"BatcherSupervisor_{key}", strategy=Strategy.REST_FOR_ONE,
            max_restarts=BROADWAY_MAX_RESTARTS, max_seconds=BROADWAY_MAX_SECONDS,
            children=[*([committer] if committer is not None else []), batcher,
                      SupervisorSpec(id=f"BatchProcessorSupervisor_{key}",
                                     strategy=Strategy.ONE_FOR_ALL, max_restarts=0,
                                     children=bps)]))

    children: list = []
    if spark_child is not None:
        topo.spark = spark_child.id
        topo.roles[spark_child.id] = "spark"
        children.append(spark_child)
    children.append(SupervisorSpec(
        id="ProducerSupervisor", strategy=Strategy.ONE_FOR_ONE,
        max_restarts=config.producer.max_restarts, max_seconds=config.producer.max_seconds,
        children=producers))
    children.append(SupervisorSpec(
        id="ProcessorSupervisor", strategy=Strategy.ONE_FOR_ALL, max_restarts=0,
        children=processors))
    if batcher_sups:
        children.append(SupervisorSpec(id="BatchersSupervisor", strategy=Strategy.ONE_FOR_ONE,
                                       max_restarts=BROADWAY_MAX_RESTARTS,
                                       max_seconds=BROADWAY_MAX_SECONDS,
                                       children=batcher_sups))
    # every processor crash is one restart here (ProcessorSupervisor gives up at once), so
    # this intensity is what lets a poison message reach max_crashes and be failed
    topo.root = SupervisorSpec(id="PipelineSupervisor", strategy=Strategy.REST_FOR_ONE,
                               children=children, shutdown=INFINITY,
                               max_restarts=p.max_restarts, max_seconds=p.max_seconds)
    return topo
