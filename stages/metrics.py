"""A stage's Prometheus metrics, written in prometheus-client's multiprocess mode.

The daemon sets ``PROMETHEUS_MULTIPROC_DIR`` in every stage's environment and serves the
one ``/metrics`` endpoint that aggregates the files (see ``offbroadway.daemon.metrics``).
Without that variable (a stage run by hand, unit tests) every call here does nothing and
prometheus-client is not even imported.

Counters are not incremented on the message hot path: the stage keeps plain integer
counters and :meth:`StageMetrics.flush` adds their deltas once per tick (about a second).
Counter files of dead processes are kept by multiprocess mode, so a restarted stage does
not reset the totals an operator sees.  Histogram observations (one per frame or batch)
are accumulated the same way, as bucket counts and a sum in plain Python, and published
per tick: prometheus-client checks the pid and writes its mmap on every call.
"""

from __future__ import annotations

import contextlib
import os
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

#: stage counter name -> (metric name, help)
COUNTERS = {
    "in": ("offbroadway_messages_received_total", "Messages a stage received."),
    "out": ("offbroadway_messages_processed_total", "Messages a stage handled and passed on."),
    "failed": ("offbroadway_messages_failed_total", "Messages failed (handler or source)."),
    "acked": ("offbroadway_messages_acked_total", "Messages acknowledged."),
    "requeued": ("offbroadway_messages_requeued_total",
                 "In-flight messages handed back to the source after a downstream exit."),
    "poison_strikes": ("offbroadway_poison_strikes_total",
                       "Processor crashes blamed on a message (each one redelivers it)."),
    "poison_failed": ("offbroadway_poison_messages_total",
                      "Messages failed as poison after killing a processor max_crashes times."),
    "malformed": ("offbroadway_malformed_frames_total", "Frames dropped as malformed."),
    "batches": ("offbroadway_batches_total", "Batches emitted or handled."),
}
#: stage gauge name -> (metric name, help)
GAUGES = {
    "demand": ("offbroadway_demand_outstanding", "Demand consumers have placed and not yet met."),
    "buffered": ("offbroadway_buffered_messages", "Messages waiting in a stage's buffer."),
    "inflight": ("offbroadway_inflight_messages", "Messages emitted by a producer, not yet acked."),
    "source_connected": ("offbroadway_source_connected",
                         "1 while a producer's source is connected (always 1 for sources "
                         "without a connection), 0 while it retries."),
}
HISTOGRAMS = {
    "handle_message": ("offbroadway_handle_message_seconds",
                       "handle_message time per message (mean over each frame).",
                       (0.00001, 0.0001, 0.001, 0.01, 0.1, 0.5, 1, 5)),
    "handle_batch": ("offbroadway_handle_batch_seconds", "handle_batch time per batch.",
                     (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)),
    "spark_write": ("offbroadway_spark_write_seconds",
                    "Spark commit time: per job (committer) and per batch from hand-off to "
                    "answer (batch processor).",
                    (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)),
    "spark_commit_rows": ("offbroadway_spark_commit_rows", "Rows per Spark job (group commit).",
                          (1000, 5000, 10000, 25000, 50000, 100000, 200000, 500000)),
    "batch_size": ("offbroadway_batch_size_messages", "Messages per batch.",
                   (1, 10, 100, 500, 1000, 2000, 5000, 10000, 50000, 100000)),
}
LABELS = ("pipeline", "stage", "role")


class StageMetrics:
    def __init__(self, pipeline: str, stage: str, role: str) -> None:
        self.enabled = bool(os.environ.get(MULTIPROC_ENV))
        self._last: dict[str, int] = {}
        #: (name, batcher) -> (count per bucket, [sum]) since the last flush
        self._pending: dict[tuple[str, str], tuple[list[int], list[float]]] = {}

        if not self.enabled:
            return
        from prometheus_client import Counter, Gauge, Histogram

        labels = (pipeline, stage, role)
        with _private_files():     # .labels() creates this process's mmap files
            self._counters = {k: Counter(n[: -len("_total")], h, LABELS).labels(*labels)
                              for k, (n, h) in COUNTERS.items()}
            self._gauges = {k: Gauge(n, h, LABELS, multiprocess_mode="livesum").labels(*labels)
                            for k, (n, h) in GAUGES.items()}
        self._histograms: dict[Any, Any] = {}
        self._hist_defs = HISTOGRAMS
        #: finite bucket bounds per histogram (the last bucket, +Inf, is implicit)
        self._bounds = {k: list(b) for k, (_, _, b) in HISTOGRAMS.items()}
        self._labels = labels
        self._hist_cls = Histogram

    def flush(self, counters: dict[str, int], gauges: dict[str, Any]) -> None:
        """Publish counter deltas since the last flush, the current gauge values, and the
        histogram observations accumulated since the last flush (once per tick)."""
        if not self.enabled:
            return
        for key, counter in self._counters.items():
            value = counters.get(key, 0)
            delta = value - self._last.get(key, 0)
            if delta > 0:
                counter.inc(delta)
            self._last[key] = value
        for key, gauge in self._gauges.items():
            value = gauges.get(key)
            if isinstance(value, (int, float)):
                gauge.set(value)
        if self._pending:
            pending, self._pending = self._pending, {}
            for (name, batcher), (counts, total) in pending.items():
                self._publish(self._histogram(name, batcher), counts, total)

    def observe(self, name: str, value: float, batcher: str = "") -> None:
        """Count one observation in plain Python (a bucket count and a sum): the
        prometheus-client call, which checks the pid and writes the mmap file on every
        observe, happens once per tick in :meth:`flush`."""
        if not self.enabled:
            return
        acc = self._pending.get((name, batcher))
        if acc is None:
            acc = self._pending[(name, batcher)] = ([0] * (len(self._bounds[name]) + 1), [0.0])
        acc[0][bisect_left(self._bounds[name], value)] += 1
        acc[1][0] += value

    def _histogram(self, name: str, batcher: str) -> Any:
        hist = self._histograms.get((name, batcher))
        if hist is None:
            metric, help_text, buckets = self._hist_defs[name]
            family = self._histograms.get(name)
            if family is None:
                family = self._hist_cls(metric, help_text, (*LABELS, "batcher"), buckets=buckets)
                self._histograms[name] = family
            with _private_files():
                hist = family.labels(*self._labels, batcher)
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
