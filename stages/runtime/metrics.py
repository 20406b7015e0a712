"""A stage's Prometheus metrics, written in prometheus-client's multiprocess mode.

The daemon sets ``PROMETHEUS_MULTIPROC_DIR`` in every stage's environment and serves the
one ``/metrics`` endpoint that aggregates the files (see ``offbroadway.daemon.metrics``).
Without that variable (a stage run by hand, unit tests) every call here does nothing and
prometheus-client is not even imported.

Counters are not incremented on the message hot path: the stage keeps plain integer
counters and :meth:`StageMetrics.flush` adds their deltas once per tick (about a second).
Counter files of dead processes are kept by multiprocess mode, so a restarted stage does
not reset the totals an operator sees.  Histogram observations (one per frame or batch,
each standing for ``count`` items) are accumulated the same way, as bucket counts and a
sum in plain Python, and published per tick: prometheus-client checks the pid and writes
its mmap on every call.

So that a plain ``sum()`` means something, a stage exports only the counts its role owns
(:func:`counter_for`): the acked and failed messages are the sources' books, exported by
producers alone (every stage that acks or fails a message counts it too, for ``status``,
and summing those double-counted); the stages that fail messages say so in
``stage_failed_messages_total``.  A series is created when its role first counts it, so no
role exports a zero it can never move.  Every series names its child with the label
``child``, as the tree's own metrics do.
"""

from __future__ import annotations

import contextlib
import os
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

#: stage counter name -> (metric name, help), for every role that counts it
COUNTERS = {
    "in": ("offbroadway_messages_received_total", "Messages a stage received."),
    "out": ("offbroadway_messages_processed_total", "Messages a stage handled and passed on."),
    "requeued": ("offbroadway_messages_requeued_total",
                 "In-flight messages handed back to the source after a downstream exit."),
    "poison_strikes": ("offbroadway_poison_strikes_total",
                       "Processor crashes blamed on a message (each one redelivers it)."),
    "poison_failed": ("offbroadway_poison_messages_total",
                      "Messages failed as poison after killing a processor max_crashes times."),
    "malformed": ("offbroadway_malformed_frames_total", "Frames dropped as malformed."),
    "batches": ("offbroadway_batches_total", "Batches emitted or handled."),
    "failures": ("offbroadway_message_failures_total",
                 "Failed deliveries settled at the source: a message a requeuing policy "
                 "sends back counts again each time it fails (messages_failed counts it "
                 "once)."),
}
#: the sources' books: the producers' counts alone (one role owns each count)
SOURCE_COUNTERS = {
    "acked": ("offbroadway_messages_acked_total", "Messages acknowledged at their source."),
    "failed": ("offbroadway_messages_failed_total",
               "Messages settled as failed at their source (its failure policy), each "
               "once; under a requeuing policy those back in the queue are "
               "offbroadway_messages_failing."),
}
#: where messages fail: the stages that run callbacks and hand failures to handle_failed
STAGE_FAILED = ("offbroadway_stage_failed_messages_total",
                "Messages a stage failed and handed to handle_failed.")
#: roles whose ``failed`` count is :data:`STAGE_FAILED` (a committer's failed rows are
#: failed again, and counted, by the batch processor that handed them over)
FAILING_ROLES = frozenset({"processor", "batch_processor"})


def counter_for(role: str, key: str) -> tuple[str, str] | None:
    """The metric (name, help) a ``role``'s counter ``key`` is exported as, or None."""
    if key in SOURCE_COUNTERS:
        if role == "producer":
            return SOURCE_COUNTERS[key]
        if key == "failed" and role in FAILING_ROLES:
            return STAGE_FAILED
        return None
    return COUNTERS.get(key)


#: stage gauge name -> (metric name, help)
GAUGES = {
    "demand": ("offbroadway_demand_outstanding", "Demand consumers have placed and not yet met."),
    "buffered": ("offbroadway_buffered_messages", "Messages waiting in a stage's buffer."),
    "inflight": ("offbroadway_inflight_messages", "Messages emitted by a producer, not yet acked."),
    "failing": ("offbroadway_messages_failing",
                "Messages that failed in this run and are back in the queue (a requeuing "
                "failure policy): failed, not settled."),
    "source_connected": ("offbroadway_source_connected",
                         "1 while a producer's source is connected (always 1 for sources "
                         "without a connection), 0 while it retries."),
}
HISTOGRAMS = {
    "handle_message": ("offbroadway_handle_message_seconds",
                       "handle_message time per message (each message of a frame observed "
                       "at the frame's mean).",
                       (0.00001, 0.0001, 0.001, 0.01, 0.1, 0.5, 1, 5, 30)),
    "handle_batch": ("offbroadway_handle_batch_seconds", "handle_batch time per batch.",
                     (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)),
    "spark_write": ("offbroadway_spark_write_seconds",
                    "Time of one Spark job (a group commit), retries included (committer).",
                    (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)),
    "spark_wait": ("offbroadway_spark_batch_wait_seconds",
                   "Per batch, from the hand-off to the committer to its answer (batch "
                   "processor).",
                   (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)),
    "spark_commit_rows": ("offbroadway_spark_commit_rows", "Rows per Spark job (group commit).",
                          (1000, 5000, 10000, 25000, 50000, 100000, 200000, 500000)),
    "batch_size": ("offbroadway_batch_size_messages", "Messages per batch.",
                   (1, 10, 100, 500, 1000, 2000, 5000, 10000, 50000, 100000)),
}
LABELS = ("pipeline", "child", "role")
#: histograms of a processor, which has no batcher: no ``batcher`` label
UNBATCHED = frozenset({"handle_message"})


class StageMetrics:
    def __init__(self, pipeline: str, stage: str, role: str) -> None:
        self.enabled = bool(os.environ.get(MULTIPROC_ENV))
        self.role = role
        self._last: dict[str, int] = {}
        #: (name, batcher) -> (count per bucket, [sum]) since the last flush
        self._pending: dict[tuple[str, str], tuple[list[int], list[float]]] = {}

        if not self.enabled:
            return
        from prometheus_client import Counter, Gauge, Histogram

        labels = (pipeline, stage, role)
        #: counter key -> its series, made when the role first counts it (:meth:`flush`)
        self._counters: dict[str, Any] = {}
        self._counter_cls = Counter
        #: gauge key -> its series, made when the stage first reports the figure (a
        #: processor has no source to be connected: it exports no source_connected 0)
        self._gauges: dict[str, Any] = {}
        self._gauge_families = {k: Gauge(n, h, LABELS, multiprocess_mode="livesum")
                                for k, (n, h) in GAUGES.items()}
        self._histograms: dict[Any, Any] = {}
        self._hist_defs = HISTOGRAMS
        #: finite bucket bounds per histogram (the last bucket, +Inf, is implicit)
        self._bounds = {k: list(b) for k, (_, _, b) in HISTOGRAMS.items()}
        self._labels = labels
        self._hist_cls = Histogram
        self._counter_families: dict[str, Any] = {}
        if role == "producer":
            # the sources' books exist from the start, at 0: a failure ratio or a stall
            # query reads them whether or not anything has failed yet
            for key in SOURCE_COUNTERS:
                self._counter(key)

    def flush(self, counters: dict[str, int], gauges: dict[str, Any]) -> None:
        """Publish counter deltas since the last flush, the current gauge values, and the
        histogram observations accumulated since the last flush (once per tick)."""
        if not self.enabled:
            return
        for key, value in counters.items():
            delta = value - self._last.get(key, 0)
            if delta > 0:
                counter = (self._counters[key] if key in self._counters
                           else self._counter(key))
                if counter is not None:
                    counter.inc(delta)
            self._last[key] = value
        for key, family in self._gauge_families.items():
            value = gauges.get(key)
            if isinstance(value, (int, float)):
                gauge = self._gauges.get(key)
                if gauge is None:
                    with _private_files():     # .labels() creates this process's mmap file
                        gauge = self._gauges[key] = family.labels(*self._labels)
                gauge.set(value)
        if self._pending:
            pending, self._pending = self._pending, {}
            for (name, batcher), (counts, total) in pending.items():
                self._publish(self._histogram(name, batcher), counts, total)

    def _counter(self, key: str) -> Any:
        """The series of counter ``key`` for this role (None: the role does not export
        it), made on its first count."""
        metric = counter_for(self.role, key)
        if metric is None:
            self._counters[key] = None
            return None
        name, help_text = metric
        family = self._counter_families.get(name)
        if family is None:
            family = self._counter_families[name] = self._counter_cls(
                name[: -len("_total")], help_text, LABELS)
        with _private_files():
            counter = self._counters[key] = family.labels(*self._labels)
        return counter

    def observe(self, name: str, value: float, batcher: str = "", count: int = 1) -> None:
        """Count ``count`` observations of ``value`` in plain Python (bucket counts and a
        sum): the prometheus-client call, which checks the pid and writes the mmap file
        on every observe, happens once per tick in :meth:`flush`.  ``count`` lets a frame
        stand for its messages (each observed at the frame's mean)."""
        if not self.enabled:
            return
        acc = self._pending.get((name, batcher))
        if acc is None:
            acc = self._pending[(name, batcher)] = ([0] * (len(self._bounds[name]) + 1), [0.0])
        acc[0][bisect_left(self._bounds[name], value)] += count
        acc[1][0] += value * count

    def _histogram(self, name: str, batcher: str) -> Any:
        hist = self._histograms.get((name, batcher))
        if hist is None:
            metric, help_text, buckets = self._hist_defs[name]
            family = self._histograms.get(name)
            batched = name not in UNBATCHED
            if family is None:
                family = self._hist_cls(metric, help_text,
                                        (*LABELS, "batcher") if batched else LABELS,
                                        buckets=buckets)
                self._histograms[name] = family
            with _private_files():
                hist = family.labels(*self._labels, *((batcher,) if batched else ()))
            self._histograms[(name, batcher)] = hist
        return hist

    def _publish(self, hist: Any, counts: list[int], total: list[float]) -> None:
        """Add accumulated bucket counts to a prometheus-client histogram: each bucket's
        value once, as ``Histogram.observe`` would have after that many calls (its
        buckets are stored per bound, not cumulative; the last is +Inf)."""
        buckets = getattr(hist, "_buckets", None)
        hsum = getattr(hist, "_sum", None)
        if buckets is None or hsum is None or len(buckets) != len(counts):
            # another prometheus-client layout: observe each bucket's count at its bound
            bounds = [*hist._upper_bounds] if hasattr(hist, "_upper_bounds") else []
            for i, c in enumerate(counts):
                for _ in range(c):
                    hist.observe(bounds[i] if i < len(bounds) else float("inf"))
            return
        hsum.inc(total[0])
        for i, c in enumerate(counts):
            if c:
                buckets[i].inc(c)


@contextlib.contextmanager
def _private_files() -> Iterator[None]:
    """Files created inside are 0600: the metrics dir is private, its files should be too
    (prometheus-client creates them with the process umask)."""
    old = os.umask(0o177)
    try:
        yield
    finally:
        os.umask(old)
