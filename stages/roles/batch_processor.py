"""The batch processor stage: ``handle_batch``, the hand-off to Spark, then the acks.

It asks its batcher for ``max_demand`` batches at a time.  A message is acked only after
its batch is written (or, with no Spark sink, after ``handle_batch`` returned it): that is
the point where "nothing lost" is decided.  A message that ``handle_batch`` leaves out of
its result is failed ("not returned by handle_batch"), never dropped silently.  When the
batcher cancels (the drain), the stage reports ``done`` to the daemon once every batch it
holds is written and acked; when a resize removes it, it cancels its subscription itself
and reports ``left`` the same way (:mod:`.consumer_stage`).

With Spark, a batch's rows become one Arrow table here (:mod:`.spark_rows`: a message
that does not fit the schema fails alone, now), written as a Parquet file into the
staging area (:mod:`.spark_staging`) whose name goes to the batcher's committer
(:mod:`.committer`), which has Spark read the files of all batch processors in one job;
the batch is acked when the committer answers.  Demand for the next batch is given back only
then, so the batches waiting for Spark are bounded by ``max_demand`` (sized by the
topology from the commit size) and a stalled Spark stops the pipeline upstream.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any

import zmq
from offbroadway import BatchInfo, Message

from ..runtime import callbacks
from ..runtime.handler import load_handler
from ..runtime.spec import HandoffSpark, StageSpec
from ..runtime.stage import ZmqIO
from ..wire import commands, protocol
from .acker import Acker
from .consumer import Subscriptions, Upstream
from .consumer_stage import ConsumerStage

log = logging.getLogger("offbroadway.batch_processor")


class BatchProcessorStage(ConsumerStage):
    #: restarted with its batcher (``rest_for_one``), never resubscribed; resizes remove it
    CASCADE = (commands.Leave,)
    #: A batch frame is a whole ``handle_batch`` (and, with Spark, an Arrow conversion):
    #: a burst of 100 would keep the loop from the committer's answers, the acks and the
    #: heartbeat for 100 user calls.  10 batches are still hundreds of messages per wake-up.
    UPSTREAM_BURST = 10

    def __init__(self, spec: StageSpec, io: ZmqIO | None = None) -> None:
        super().__init__(spec, io)
        self.handler = load_handler(spec.handler)
        self.context = spec.context
        # batches go to a batch processor that is free: the demand on the batcher is a
        # window that follows the pace of handle_batch (one batch while they are slow, up
        # to max_demand while they are quick; :class:`.window.PacedWindow`)
        self.subs = Subscriptions(spec.max_demand, spec.min_demand, counters=self.counters,
                                  paced=True)
        self.spark = _SparkHandoff(self) if spec.spark is not None else None
        self.counters.update(batches=0)

    def setup(self) -> None:
        if self.spark is not None:
            self.spark.connect()
        socks = [self.dealer(p) for p in self.spec.producers]
        for sock in socks:
            self.register(sock, self._on_producer)
        self.acker = Acker(socks, self.handler, self.context, self.counters, self.failures)
        sock = self.dealer(self.spec.upstream[0])
        partition = self.spec.index if self.spec.partition_by else None
        self.subs.add(self.spec.upstream[0], sock, partition)
        self.register(sock, self._on_upstream)

    def teardown(self) -> None:
        if self.spark is not None:
            self.spark.abandon()

    def stats(self) -> dict[str, Any]:
        # per batcher subscription: batches handled and batches asked for (the live page)
        return {**super().stats(), "edges": self.subs.edges()}

    def _on_producer(self, sock: zmq.Socket) -> None:
        # Producers only ever cancel an unknown subscription here; nothing to do.
        while sock.get(protocol.ZMQ_EVENTS) & protocol.ZMQ_POLLIN:
            sock.recv(zmq.NOBLOCK)

    def _on_upstream(self, sock: zmq.Socket) -> None:
        up = self.subs.by_sock[sock]
        for msg in self.frames(sock, up.stage_id):
            if msg[protocol.KIND_AT] == protocol.BATCH:
                self.subs.received(up, 1)
                self._handle(up, msg[protocol.BATCH_KEY], msg[protocol.BATCH_TRIGGER],
                             msg[protocol.BATCH_PACKED])
            elif msg[protocol.KIND_AT] == protocol.CANCEL:
                self.subs.cancelled(up, msg[protocol.VALUE])
                self.maybe_finish()

    def maybe_finish(self) -> None:
        if self.spark is not None and self.subs.all_done and not self.finished:
            self.spark.drained()   # nothing more comes: its committer need not wait
        super().maybe_finish()

    def holding(self) -> bool:
        """Batches handed to Spark whose commit has not answered (the consumer cascade,
        :mod:`.consumer_stage`: a leaving or drained batch processor finishes once every
        batch it was sent is written and acked)."""
        return self.spark is not None and self.spark.holding

    def _handle(self, up: Upstream, batch_key: Any, trigger: str, packed: bytes) -> None:
        try:
            events = protocol.open_events(packed)
        except protocol.ProtocolError as exc:
            self.counters["malformed"] += 1
            log.warning("%s: dropped a malformed batch: %s", self.id, exc)
            self.subs.consumed(up, 1)
            return
        self.counters["in"] += len(events)
        self.counters["batches"] += 1
        batcher = self.spec.batcher
        messages = protocol.to_messages(events, None, batcher, batch_key)
        info = BatchInfo(batcher, batch_key, len(messages), trigger,
                         self.spec.index if self.spec.partition_by else None)
        started = time.perf_counter()
        rows = callbacks.handle_batch(self.handler, batcher, messages, info, self.context)
        took = time.perf_counter() - started
        self.subs.timed(up, 1, took)
        self.metrics.observe("handle_batch", took, batcher)
        self.metrics.observe("batch_size", len(messages), batcher)
        if self.spark is not None and rows:
            self.spark.hand_off(HandedBatch(up, trigger, messages, rows))   # acked on the answer
            return
        self.ack_batch(up, messages, rows)

    def ack_batch(self, up: Upstream, messages: list[Message], rows: list[Message]) -> None:
        """Ack what was written, fail the rest, and give the batch's demand back.  At once,
        as Broadway acks a batch when ``handle_batch`` returns: acks held for the batches
        read with it would wait for their ``handle_batch`` too (prefetch slots held, and
        written again if this stage dies meanwhile)."""
        ok = [m for m in rows if m.status is None]
        failed = [m for m in messages if m.status is not None]
        self.counters["out"] += len(ok)
        self.acker.finish(ok, failed)
        self.subs.consumed(up, 1)


@dataclass(frozen=True, slots=True)
class HandedBatch:
    """A handled batch on its way to Spark: the upstream whose demand it gives back, the
    trigger that cut it, the messages it brought and the rows ``handle_batch`` returned."""

    up: Upstream
    trigger: str
    messages: list[Message]
    rows: list[Message]


@dataclass(frozen=True, slots=True)
class Committing:
    """A batch whose COMMIT went to the committer, and when (its Spark wait starts)."""

    batch: HandedBatch
    sent_at: float


@dataclass(frozen=True, slots=True)
class FileSchema:
    """The Arrow schema of the files staged last, and its IPC bytes (sent with each
    COMMIT, encoded again only when the schema changes)."""

    schema: Any       # pa.Schema
    ipc: bytes


class _SparkHandoff:
    """The batch processor's side of its committer (:mod:`.protocol`'s Spark hand-off)."""

    def __init__(self, stage: BatchProcessorStage) -> None:
        self.stage = stage
        spark = stage.spec.spark
        assert isinstance(spark, HandoffSpark), spark
        self.partition_by = spark.partition_by
        #: ``[spark] schema = "evolve"``: new fields widen the schema (spark_evolve)
        self.evolve = spark.evolve
        self.schema: Any = None              # pa.Schema of the data columns, once known
        self.schema_bytes: bytes | None = None
        self.schema_error: str | None = None
        self.schema_known = False            # the committer answered HELLO
        self.staging: Any = None             # its StagingDir, from that answer
        self.file_schema: FileSchema | None = None
        self.queued: list[HandedBatch] = []  # batches that came before that answer
        # refs start at random so a new incarnation never takes an old one's answer
        self.next_ref = secrets.randbits(48)
        #: batches whose commit has not answered, by their COMMIT's ref
        self.pending: dict[int, Committing] = {}
        #: told the committer that nothing more follows (DRAINED) since the last COMMIT
        self.said_drained = False
        _warm_arrow()

    @property
    def holding(self) -> bool:
        return bool(self.pending or self.queued)

    def connect(self) -> None:
        stage = self.stage
        self.sock = stage.dealer(stage.spec.committer)
        stage.register(self.sock, self._on_committer)
        self.sock.send(protocol.hello())

    def hand_off(self, batch: HandedBatch) -> None:
        if not self.schema_known:
            self.queued.append(batch)
            return
        import pyarrow as pa

        from ..spark import spark_rows, spark_staging

        rows = batch.rows
        if self.evolve and self.schema is not None:
            from ..spark.spark_evolve import widen

            self.schema = widen(self.schema, [m.data for m in rows if m.status is None])
        converted = spark_rows.convert(rows, self.schema, self.partition_by, self.schema_error)
        if self.schema is None:
            self.schema = converted.schema
        if converted.failed and self.schema_error is None:   # the committer said that one
            log.warning("%s: %d of %d message(s) cannot be rows; e.g. %s", self.stage.id,
                        len(converted.failed), len(rows), converted.failed[0].status)
        table = converted.table
        if table is None:
            self.stage.ack_batch(batch.up, batch.messages, rows)
            return
        ref = self.next_ref
        self.next_ref += 1
        # messages their source may have delivered before: the committer looks them up
        again = spark_staging.redelivered_ids(converted.written)
        name = spark_staging.staged_name(self.stage.id, ref, bool(again))
        try:
            self.staging.write(table, name, again)
        except (OSError, pa.ArrowException) as exc:   # a full disk: fail, never crash
            reason = f"spark: staging the batch failed: {type(exc).__name__}: {exc}"
            for m in converted.written:
                m.status = reason
            self.stage.ack_batch(batch.up, batch.messages, rows)
            return
        if self.file_schema is None or not self.file_schema.schema.equals(table.schema):
            self.file_schema = FileSchema(table.schema, spark_rows.schema_to_ipc(table.schema))
        self.sock.send(protocol.commit(ref, batch.trigger, len(table), name,
                                       self.file_schema.ipc))
        self.said_drained = False
        self.pending[ref] = Committing(batch, time.perf_counter())

    def drained(self) -> None:
        """The upstream has finished: tell the committer, once, while batches of ours wait
        for its commit, so that it commits them now rather than at its interval."""
        if self.pending and not self.said_drained:
            self.said_drained = True
            self.sock.send(protocol.drained())

    def _on_committer(self, sock: zmq.Socket) -> None:
        stage = self.stage
        while True:
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                msg = protocol.decode(frame)
            except protocol.ProtocolError as exc:
                stage.counters["malformed"] += 1
                log.warning("%s: dropped a malformed frame from the committer: %s", stage.id, exc)
                continue
            kind = msg[protocol.KIND_AT]
            if kind == protocol.SCHEMA:
                from ..spark.spark_staging import StagingDir

                self._adopt(msg[protocol.SCHEMA_IPC])
                self.schema_error = msg[protocol.SCHEMA_ERROR]
                self.staging = StagingDir(msg[protocol.SCHEMA_STAGING])
                self.schema_known = True
                queued, self.queued = self.queued, []
                for batch in queued:
                    self.hand_off(batch)
                # a queued batch none of whose rows fit is acked here, with no RESULT
                # to come: the drain may be waiting for this stage's last batch
                stage.maybe_finish()
            elif kind == protocol.RESULT:
                entry = self.pending.pop(msg[protocol.RESULT_REF], None)
                if entry is None:
                    continue   # an answer for an earlier incarnation of this stage
                self._adopt(msg[protocol.RESULT_SCHEMA])
                batch = entry.batch
                error = msg[protocol.RESULT_ERROR]
                if error:
                    for m in batch.rows:
                        if m.status is None:
                            m.status = error
                stage.metrics.observe("spark_wait", time.perf_counter() - entry.sent_at,
                                      stage.spec.batcher)
                stage.ack_batch(batch.up, batch.messages, batch.rows)
                stage.maybe_finish()

    def _adopt(self, schema_ipc: bytes | None) -> None:
        """The dataset's schema, as the committer fixed it: convert to it from now on."""
        if schema_ipc is not None and schema_ipc != self.schema_bytes:
            from ..spark import spark_rows

            self.schema = spark_rows.schema_from_ipc(schema_ipc)
            self.schema_bytes = schema_ipc

    def abandon(self) -> None:
        """Stopping with batches whose commit has not answered: they stay unacked and the
        producers deliver them again when this stage is gone.  Not answered is not "not
        committed": the committer may be committing them right now (it finishes a job it
        started), and then their rows are written again on redelivery; the daemon's end
        of run counts the rows the committer committed."""
        if self.holding:
            n = sum(len(c.batch.messages) for c in self.pending.values()) + sum(
                len(b.messages) for b in self.queued)
            log.info("%s: stopping; %d batch(es) of %d message(s) left unacked, delivered "
                     "again (their commit had not answered: if the committer still "
                     "commits them, they are acknowledged without being written again "
                     "when they come back)", self.stage.id,
                     len(self.pending) + len(self.queued), n)


def _warm_arrow() -> None:
    """Import the Spark hand-off's modules and run pyarrow's first conversion (~0.2 s of
    CPU the first time: its kernels load) while the stage starts, not in its first batch."""
    from ..spark import spark_rows, spark_staging  # noqa: F401

    spark_rows.infer_schema([{"i": 1, "f": 0.5, "s": "x"}])
