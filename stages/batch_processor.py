"""The batch processor stage: ``handle_batch``, the Spark write, then the acks.

It asks its batcher for one batch at a time plus one in reserve.  A message is acked only
after its batch is written (or, with no Spark sink, after ``handle_batch`` returned it):
that is the point where "nothing lost" is decided.  A message that ``handle_batch``
leaves out of its result is failed ("not returned by handle_batch"), never dropped
silently.  When the batcher cancels (the drain), the stage reports ``done`` to the daemon.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import zmq
from offbroadway import BatchInfo
from offbroadway.supervision import child

from . import callbacks, protocol
from .acker import Acker
from .consumer import Subscriptions
from .spec import StageSpec
from .stage import Stage, StageExit, load_handler

log = logging.getLogger("offbroadway.batch_processor")


class BatchProcessorStage(Stage):
    def __init__(self, spec: StageSpec) -> None:
        super().__init__(spec)
        self.handler = load_handler(spec.handler)
        self.context = spec.context
        self.subs = Subscriptions(spec.max_demand, spec.min_demand, counters=self.counters)
        self.sink = None
        self.counters.update(batches=0)
        #: handled messages whose ACK goes out at the end of this wake-up
        self._ok: list = []

    def setup(self) -> None:
        if self.spec.spark:
            from .spark_sink import SparkSink  # pyspark stays out of every other stage

            self.sink = SparkSink(**self.spec.spark, writer_id=self.id, on_wait=child.heartbeat,
                                  should_stop=lambda: not self.running)
        socks = [self.dealer(p) for p in self.spec.producers]
        for sock in socks:
            self.register(sock, self._on_producer)
        self.acker = Acker(socks, self.handler, self.context, self.counters, self.failures)
        sock = self.dealer(self.spec.upstream[0])
        partition = self.spec.index if self.spec.partition_by else None
        self.subs.add(self.spec.upstream[0], sock, partition)
        self.register(sock, self._on_upstream)

    def teardown(self) -> None:
        if self.sink is not None:
            self.sink.close()   # an open Connect session can hang the process's exit in grpc

    def _on_producer(self, sock: zmq.Socket) -> None:
        # Producers only ever cancel an unknown subscription here; nothing to do.
        while sock.get(protocol.ZMQ_EVENTS) & protocol.ZMQ_POLLIN:
            sock.recv(zmq.NOBLOCK)

    def _on_upstream(self, sock: zmq.Socket) -> None:
        up = self.subs.by_sock[sock]
        for _ in range(10):
            if not sock.get(protocol.ZMQ_EVENTS) & protocol.ZMQ_POLLIN:
                break
            frame = sock.recv(zmq.NOBLOCK)
            msg = self.decode(frame, up.stage_id)
            if msg is None:
                continue
            if msg[protocol.KIND_AT] == protocol.BATCH:
                self._handle(msg[protocol.BATCH_KEY], msg[protocol.BATCH_TRIGGER],
                             msg[protocol.BATCH_PACKED])
                self.subs.consumed(up, 1)
            elif msg[protocol.KIND_AT] == protocol.CANCEL:
                self._ack()
                self.subs.cancelled(up, msg[protocol.VALUE])
                if self.subs.all_done:
                    self.report("done", self.stats())   # final counts: the last tick may be older
        self._ack()

    def _ack(self) -> None:
        if self._ok:
            ok, self._ok = self._ok, []
            self.acker.finish(ok, ())

    def _handle(self, batch_key: Any, trigger: str, packed: bytes) -> None:
        try:
            events = protocol.open_events(packed)
        except protocol.ProtocolError as exc:
            self.counters["malformed"] += 1
            log.warning("%s: dropped a malformed batch: %s", self.id, exc)
            return
        self.counters["in"] += len(events)
        self.counters["batches"] += 1
        batcher = self.spec.batcher
        messages = protocol.to_messages(events, None, batcher, batch_key)
        info = BatchInfo(batcher, batch_key, len(messages), trigger,
                         self.spec.index if self.spec.partition_by else None)
        started = time.perf_counter()
        rows = callbacks.handle_batch(self.handler, batcher, messages, info, self.context)
        wrote = time.perf_counter()
        if self.sink is not None and rows:
            from .spark_sink import WriteAbandoned

            try:
                self.sink.write(batcher, rows)   # marks the messages it could not write failed
            except WriteAbandoned:
                # told to stop (SIGTERM) while Spark was failing: ack nothing; the producers
                # requeue this batch when we exit, as for any stage that dies holding messages
                log.warning("%s: stopping; a batch of %d left unacked (Spark write abandoned "
                            "between retries)", self.id, len(rows))
                raise StageExit from None
            self.metrics.observe("spark_write", time.perf_counter() - wrote, batcher)
        self.metrics.observe("handle_batch", wrote - started, batcher)
        self.metrics.observe("batch_size", len(messages), batcher)
        ok = [m for m in rows if m.status is None]
        failed = [m for m in messages if m.status is not None]
        self.counters["out"] += len(ok)
        if self.sink is None and not failed:
            # acked once per wake-up (the drain's end), not once per batch: one ACK frame
            # per producer for every batch read together; a write to Spark, which can end
            # the stage between batches, is acked at once
            self._ok.extend(ok)
            return
        self.acker.finish(self._ok + ok if self._ok else ok, failed)
        self._ok = []
