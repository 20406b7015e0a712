"""The one ``/metrics`` endpoint: the stages' multiprocess files plus the daemon's view.

Stages write their counters, gauges and histograms into ``PROMETHEUS_MULTIPROC_DIR``
(``offbroadway.stages.runtime.metrics``); the daemon aggregates them at scrape time and adds what
only it knows, computed fresh per scrape from the supervision tree and /proc
(:func:`.usage.usage`, the walk ``status`` uses too): children up, restarts, RSS and CPU
per child, and the daemon's own RSS, CPU and build.  The directory is wiped when the
daemon starts (files of a previous run would otherwise be summed in), and a dead child's
files are folded into per-type archives (:mod:`.metricsdir`), so it stays bounded through
any number of restarts.  The listener binds 127.0.0.1 unless the config says otherwise.

The HTTP server is prometheus-client's WSGI app behind our own accept loop: the library's
``start_http_server`` runs ``serve_forever``, whose ``shutdown()`` waits out a 0.5 s poll,
and that was most of a daemon's stop.  Ours waits on the listening socket and a wake-up
socket together, so :meth:`MetricsServer.shutdown` returns at once.
"""

from __future__ import annotations

import logging
import os
import selectors
import shutil
import socket
import threading
from typing import Any, Callable, Iterator
from wsgiref.simple_server import WSGIRequestHandler, make_server

from offbroadway.stages.runtime.metrics import MULTIPROC_ENV, counter_for
from offbroadway.supervision.tree import snapshot_nodes

from ..spark.wiring import SPARK_CHILD_ID
from . import metricsdir, usage

log = logging.getLogger("offbroadway.daemon.observe.metrics")


class ListenError(RuntimeError):
    """``metrics.listen`` cannot be bound (port in use, address not local...)."""


def prepare_dir(path: str) -> None:
    """Empty, private multiprocess dir; set in our environment before prometheus import."""
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path, mode=0o700)
    os.environ[MULTIPROC_ENV] = path


class TreeCollector:
    """Per-child gauges and counters read from the live supervision tree at each scrape."""

    def __init__(self, pipeline: str, snapshot: Callable[[], dict]) -> None:
        self.pipeline = pipeline
        self.snapshot = snapshot

    def collect(self) -> Iterator[object]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        up = GaugeMetricFamily("offbroadway_child_up", "1 if the child is running and ready.",
                               labels=("pipeline", "child", "kind"))
        restarts = CounterMetricFamily("offbroadway_child_restarts",
                                       "Restarts of a child (worker or supervisor).",
                                       labels=("pipeline", "child", "kind"))
        rss = GaugeMetricFamily("offbroadway_child_resident_memory_bytes",
                                "Resident set size of a child process.",
                                labels=("pipeline", "child", "kind"))
        cpu = CounterMetricFamily("offbroadway_child_cpu_seconds",
                                  "CPU time (user + system) of a child process's current "
                                  "incarnation.", labels=("pipeline", "child", "kind"))

        tree = self.snapshot()
        for node in snapshot_nodes(tree):
            labels = (self.pipeline, node["id"], node["kind"])
            up.add_metric(labels, 1.0 if node["state"] == "running" else 0.0)
            restarts.add_metric(labels, float(node.get("restarts", 0)))
        for node, (rss_bytes, cpu_seconds) in usage.usage(tree, SPARK_CHILD_ID):
            labels = (self.pipeline, node["id"], node["kind"])
            rss.add_metric(labels, float(rss_bytes))
            cpu.add_metric(labels, cpu_seconds)
        yield from (up, restarts, rss, cpu)


class DaemonCollector:
    """The daemon process itself (its CPU and memory: the children's series leave it out)
    and the build it runs (``offbroadway_build_info``, 1, labelled with the versions), read
    at each scrape."""

    def __init__(self, pipeline: str) -> None:
        import platform

        from offbroadway import __version__

        self.pipeline = pipeline
        self.build = (pipeline, __version__, platform.python_version())

    def collect(self) -> Iterator[object]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        info = GaugeMetricFamily("offbroadway_build_info",
                                 "1, labelled with the offbroadway and Python versions.",
                                 labels=("pipeline", "version", "python"))
        info.add_metric(self.build, 1.0)
        yield info
        figures = usage.process_usage(os.getpid())
        if figures is None:
            return
        rss = GaugeMetricFamily("offbroadway_daemon_resident_memory_bytes",
                                "Resident set size of the daemon process.",
                                labels=("pipeline",))
        rss.add_metric((self.pipeline,), float(figures[0]))
        cpu = CounterMetricFamily("offbroadway_daemon_cpu_seconds",
                                  "CPU time (user + system) of the daemon process.",
                                  labels=("pipeline",))
        cpu.add_metric((self.pipeline,), figures[1])
        yield from (rss, cpu)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Scrapes are not worth a log line each."""


class MetricsServer:
    """A threading WSGI server on its own accept loop, stoppable without a poll timeout."""

    def __init__(self, host: str, port: int, app: Callable) -> None:
        from prometheus_client.exposition import ThreadingWSGIServer

        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

        class Server(ThreadingWSGIServer):
            address_family = family

        self.httpd = make_server(host, port, app, Server, handler_class=_QuietHandler)
        # non-blocking accept: a client gone between select and accept costs nothing
        self.httpd.socket.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._serve, name="metrics", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self.httpd.socket, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while True:
                for key, _ in sel.select():
                    if key.fileobj is self._wake_r:
                        return
                    # accept and hand the connection to a request thread
                    self.httpd.handle_request()

    def shutdown(self) -> None:
        """Stop accepting at once; scrapes already accepted finish on their own threads."""
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join()
        self.httpd.server_close()
        self._wake_r.close()
        self._wake_w.close()


class RateLimitCollector:
    """The pipeline's shared rate limit, read from its shared file at each scrape."""

    def __init__(self, pipeline: str, read: Callable[[], Any]) -> None:
        self.pipeline = pipeline
        self.read = read

    def collect(self) -> Iterator[object]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        b = self.read()
        labels = ("pipeline",)
        allowed = GaugeMetricFamily(
            "offbroadway_rate_limit_allowed_messages",
            "Messages all producers may fetch per interval (-1: no limit).", labels=labels)
        allowed.add_metric((self.pipeline,), float(b.allowed))
        interval = GaugeMetricFamily("offbroadway_rate_limit_interval_seconds",
                                     "The rate limit's interval.", labels=labels)
        interval.add_metric((self.pipeline,), b.interval_ns / 1e9)
        throttled = CounterMetricFamily(
            "offbroadway_rate_limit_throttled",
            "Fetches the rate limit cut short (the budget of the interval was spent).",
            labels=labels)
        throttled.add_metric((self.pipeline,), float(b.throttled))
        yield from (allowed, interval, throttled)


class SharedScrape:
    """The metrics app, its answers shared by scrapes within :data:`SCRAPE_SHARED_FOR`.

    A scrape costs the daemon a few milliseconds of CPU (reading the stages' files, each
    child's ``/proc`` figures, the text of ~150 samples): a scraper every 100 ms took
    most of a tenth of a core from a two-core machine's pipeline.  The stages publish
    once a second, so an answer up to a second old says what a new one would (the
    children's RSS and CPU aside, which are a second older at worst); one scrape
    computes it and scrapes arriving meanwhile wait for that one (they do not compute it
    again).  Keyed by everything the answer depends on: path, query (``name[]``),
    ``Accept`` (OpenMetrics) and ``Accept-Encoding`` (gzip)."""

    def __init__(self, app: Callable) -> None:
        self.app = app
        self._lock = threading.Lock()
        self._kept: dict[tuple, tuple[float, str, list, bytes]] = {}

    def __call__(self, environ: dict, start_response: Callable) -> list[bytes]:
        import time

        key = tuple(environ.get(k, "") for k in ("PATH_INFO", "QUERY_STRING", "HTTP_ACCEPT",
                                                  "HTTP_ACCEPT_ENCODING"))
        with self._lock:
            kept = self._kept.get(key)
            if kept is None or time.monotonic() - kept[0] >= SCRAPE_SHARED_FOR:
                got: dict = {}

                def keep(status: str, headers: list, exc_info: Any = None) -> Callable:
                    got.update(status=status, headers=headers)
                    return lambda data: None
                body = b"".join(self.app(environ, keep))
                kept = (time.monotonic(), got["status"], got["headers"], body)
                if len(self._kept) > 16:
                    self._kept.clear()
                if got["status"].startswith("200"):
                    self._kept[key] = kept
        start_response(kept[1], kept[2])
        return [kept[3]]


#: scrapes this close together share one answer (see :class:`SharedScrape`)
SCRAPE_SHARED_FOR = 1.0


def serve(listen: str, path: str, pipeline: str, snapshot: Callable[[], dict], *,
          rate_limit: Callable[[], Any] | None = None,
          wrap: Callable[[Callable], Callable] | None = None) -> MetricsServer:
    """Start the HTTP listener in a background thread; returns the server (``shutdown()``).
    ``wrap`` puts another WSGI app in front of the metrics one (the live page, :mod:`.web`)."""
    from prometheus_client import CollectorRegistry, make_wsgi_app

    registry = CollectorRegistry()
    registry.register(metricsdir.CompactedCollector(path))
    registry.register(TreeCollector(pipeline, snapshot))
    registry.register(DaemonCollector(pipeline))
    if rate_limit is not None:
        registry.register(RateLimitCollector(pipeline, rate_limit))
    host, _, port = listen.rpartition(":")
    try:
        app = SharedScrape(make_wsgi_app(registry))
        server = MetricsServer(host.strip("[]"), int(port), wrap(app) if wrap else app)
    except OSError as exc:
        raise ListenError(f"metrics.listen = {listen!r}: cannot listen there: "
                          f"{exc.strerror or exc}") from None
    log.info("metrics on http://%s/metrics%s", listen,
             f", the live page on http://{listen}/" if wrap else "")
    return server


def process_dead(pid: int, path: str, unpublished: dict[str, float] | None = None) -> None:
    """A stage process exited: fold its files into the archives (and any other dead
    process's the daemon was not told about), so the dir does not grow with restarts;
    ``unpublished``: what it counted after its last flush (its tally), by sample name."""
    try:
        metricsdir.compact(pid, path, unpublished)
        metricsdir.sweep(path)
    except OSError as exc:
        log.warning("metrics: cannot compact %s after pid %d exited: %s", path, pid, exc)


def landed(path: str, producer: str, acks: int) -> None:
    """Acks a killed incarnation of ``producer`` sent as it died, which the daemon learnt
    the broker got only when the drain completed: into its archived acked counter."""
    name = counter_for("producer", "acked")
    if name is not None and not metricsdir.credit(path, name[0], producer, acks):
        log.warning("metrics: %s's %d acks that landed have no counter to go to", producer,
                    acks)
