"""The batcher stage: groups one batcher key's messages into batches.

A batch is emitted when it reaches ``batch_size`` (a count, or a byte budget of encoded
data), when ``batch_timeout`` has passed since its first message, or at once when every
processor has cancelled (the drain: partial batches are not left waiting for the timeout).
Batches go to the batch processors on demand, one batch per frame; with ``partition_by``
a batch holds one partition's messages and goes to that partition's batch processor.
"""

from __future__ import annotations

import logging
import time
from typing import Any, NamedTuple

import zmq

from ..flow.batching import Batch, BatchAccumulator
from ..flow.dispatch import Dispatcher, PartitionDispatcher, SpreadDispatcher, stable_hash
from ..runtime.handler import load_handler
from ..runtime.spec import StageSpec
from ..runtime.stage import ZmqIO
from ..wire import commands, protocol
from ..wire.events import Block, row_bytes
from .consumer import Subscriptions
from .consumer_stage import ConsumerStage
from .downstream import Downstream

log = logging.getLogger("offbroadway.batcher")


class Outgoing(NamedTuple):
    """A batch on its way to a batch processor: the accumulator's :class:`Batch` fields in
    the same order, then the batch processor it must go to (its partition, None when any
    may take it) and, once fitted under the frame limit, its encoded frame."""

    key: Any
    items: Block | list[tuple]
    trigger: str
    partition: int | None
    frame: bytes | None = None


class BatcherStage(ConsumerStage):
    #: never resized, never in the first layer: only an upstream's restart
    CASCADE = (commands.Resubscribe,)

    def __init__(self, spec: StageSpec, io: ZmqIO | None = None) -> None:
        super().__init__(spec, io)
        # events stay rows of encoded data here: a byte budget counts their data's encoded
        # size plus the few bytes that address the message's ack
        self.acc = BatchAccumulator(spec.batch_size, spec.batch_timeout,
                                    row_bytes if spec.batch_bytes else None)
        self.partition_of = None
        n = spec.consumer_count
        if spec.partition_by:
            route = getattr(load_handler(spec.handler), spec.partition_by)

            def partition_of(row: tuple) -> int:
                return stable_hash(route(protocol.event_to_message(row))) % n

            self.partition_of = partition_of
            self.dispatcher: Dispatcher = PartitionDispatcher(range(n), _partition)
        else:
            self.dispatcher = SpreadDispatcher()
        self.pending: list[Outgoing] = []     # batches waiting for batch-processor demand
        self.subs = Subscriptions(spec.max_demand, spec.min_demand,
                                  can_ask=lambda: len(self.pending) <= max(1, n),
                                  counters=self.counters)
        self._timer_at: float | None = None
        self.counters.update(batches=0)
        self.accept(commands.Flush, self._on_flush)
        self.accept(commands.Batching, self._on_batching)
        self.accept(commands.Subscribe, self._on_subscribe)

    def setup(self) -> None:
        self.downstream = Downstream(self, self.dispatcher, on_change=self._on_demand)
        for processor in self.spec.upstream:
            sock = self.dealer(processor)
            self.subs.add(processor, sock, self.spec.batcher)
            self.register(sock, self._on_upstream)

    def stats(self) -> dict[str, Any]:
        s = super().stats()
        s.update(buffered=len(self.acc), pending_batches=len(self.pending),
                 edges=self.subs.edges())
        return s

    # -- upstream ---------------------------------------------------------------------------
    def _on_upstream(self, sock: zmq.Socket) -> None:
        up = self.subs.by_sock[sock]
        now = time.monotonic()
        for msg in self.frames(sock, up.stage_id):
            if msg[protocol.KIND_AT] == protocol.EVENTS:
                # moved on without being unpacked: cut into their packed bytes, regrouped
                try:
                    if msg[protocol.EVENTS_STATUS] is not None:
                        raise protocol.ProtocolError("a batcher is sent healthy events only")
                    block = protocol.open_events(msg[protocol.EVENTS_PACKED])
                except protocol.ProtocolError as exc:
                    self.counters["malformed"] += 1
                    log.warning("%s: dropped malformed events from %s: %s", self.id,
                                up.stage_id, exc)
                    continue
                batch_key = msg[protocol.EVENTS_BATCH_KEY]
                # their data left as bytes, in one codec per batch (a processor's frame of
                # data nobody read may still be a broker's bodies); counted batches grow
                # by whole columns, byte budgets and partitions look at each event's row
                block = block.transcoded()
                self.counters["in"] += len(block)
                if self.partition_of is not None:
                    partition_of = self.partition_of
                    self._emit(self.acc.add_many(
                        [((batch_key, partition_of(r)), r) for r in block.rows()], now))
                elif self.spec.batch_bytes:
                    self._emit(self.acc.add_run(batch_key, block.rows(), now))
                else:
                    self._emit(self.acc.add_run(batch_key, block, now))
                self.subs.consumed(up, len(block))
            elif msg[protocol.KIND_AT] == protocol.CANCEL:
                self.subs.cancelled(up, msg[protocol.VALUE])
                if msg[protocol.VALUE] == protocol.CANCEL_LEAVING:
                    # a processor a resize removed: everything it sent came before this
                    self.subs.remove(up)
                    self.unregister(sock)
                    log.info("%s: %s left; %d processors", self.id, up.stage_id,
                             len(self.subs.upstreams))
                    break
        if self.subs.all_done and not self.finished:
            # every processor ended its stream: partial batches go now, not at their timeout
            self._emit(self.acc.flush())
        self._arm_timer()
        self.maybe_finish()

    def _emit(self, batches: list[Batch]) -> None:
        for key, events, trigger in batches:
            if self.partition_of is None:
                self.pending.append(Outgoing(key, events, trigger, None))
            else:   # keyed by (batch key, partition): see _on_upstream
                batch_key, partition = key
                self.pending.append(Outgoing(batch_key, events, trigger, partition))
        if batches:
            self._dispatch()

    def _arm_timer(self) -> None:
        deadline = self.acc.next_deadline()
        if deadline is not None and (self._timer_at is None or deadline < self._timer_at):
            self._timer_at = deadline
            self.call_at(deadline, self._on_timer)

    def _on_batching(self, command: commands.Batching) -> None:
        """A reload changed ``batch_size``/``batch_timeout``: the batches from now on use
        them (a partial batch keeps its first message's time; a shorter timeout is armed)."""
        self._emit(self.acc.resize(command.batch_size, float(command.batch_timeout)))
        log.info("%s: batch_size %d, batch_timeout %gs (reload)", self.id, command.batch_size,
                 command.batch_timeout)
        self._arm_timer()

    def _on_timer(self) -> None:
        self._timer_at = None
        self._emit(self.acc.expire(time.monotonic()))
        self._arm_timer()

    # -- downstream (batch processors) ------------------------------------------------------
    def _on_demand(self) -> None:
        self._dispatch()
        self.maybe_finish()

    def _dispatch(self) -> None:
        if not self.pending:
            return
        fitted: list[Outgoing] = []
        for batch in self.pending:
            fitted.extend(_fit(batch) if batch.frame is None else (batch,))
        self.pending, _sent = self.downstream.deliver_each(fitted, self._encode_batch)
        if len(self.pending) <= max(1, self.spec.consumer_count):
            self.subs.release()

    def _encode_batch(self, batch: Outgoing) -> bytes:
        assert batch.frame is not None    # fitted in _dispatch
        self.counters["out"] += len(batch.items)
        self.counters["batches"] += 1
        return batch.frame

    # -- the consumer cascade (:mod:`.consumer_stage`) ----------------------------------------
    def holding(self) -> bool:
        """Batches waiting for batch-processor demand, or messages not in a batch yet."""
        return bool(self.pending) or len(self.acc) > 0

    def _on_subscribe(self, command: commands.Subscribe) -> None:
        """A resize added a processor: subscribe to it (once; a batcher started after the
        resize has it in its spec already)."""
        if self.subs.find(command.upstream) is not None or self.finished:
            return
        sock = self.dealer(command.upstream)
        self.subs.add(command.upstream, sock, self.spec.batcher)
        self.register(sock, self._on_upstream)
        log.info("%s: %s joined; %d processors", self.id, command.upstream,
                 len(self.subs.upstreams))

    def _on_flush(self, _: commands.Flush) -> None:
        """The operator's pause (``offbroadway drain``; not the stop's drain): emit partial
        batches now instead of at their timeout."""
        self._emit(self.acc.flush())


def _partition(batch: Outgoing) -> int | None:
    return batch.partition


def _fit(batch: Outgoing) -> list[Outgoing]:
    """A pending batch with its encoded frame, split in halves until each frame is within
    the receiver's MAX_FRAME_BYTES: a batch of big messages over it would be dropped by the
    batch processor, its messages left in flight forever (a stall).  A smaller batch is
    always allowed (``batch_size`` is a maximum); one message over the limit goes alone.
    Encoded here, once, rather than in the send: the size is only known encoded."""
    key, trigger = batch.key, batch.trigger
    return [batch._replace(items=part, frame=frame) for frame, part in
            protocol.frames_within_limit(batch.items,
                                         lambda e: protocol.batch(key, trigger, e))]
