"""The one ``/metrics`` endpoint: the stages' multiprocess files plus the daemon's view.

Stages write their counters, gauges and histograms into ``PROMETHEUS_MULTIPROC_DIR``
(``offbroadway.stages.metrics``); the daemon aggregates them at scrape time and adds what
only it knows, computed fresh per scrape from the supervision tree and psutil: children up,
restarts, RSS and CPU per child.  The directory is wiped when the daemon starts (files of
a previous run would otherwise be summed in) and a dead child's live gauges are removed
with ``mark_process_dead``.  The listener binds 127.0.0.1 unless the config says otherwise.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Callable, Iterator

import psutil
from offbroadway.stages.metrics import MULTIPROC_ENV

log = logging.getLogger("offbroadway.daemon.metrics")


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
                                labels=("pipeline", "child"))
        cpu = CounterMetricFamily("offbroadway_child_cpu_seconds",
                                  "CPU time (user + system) of a child process's current "
                                  "incarnation.", labels=("pipeline", "child"))

        def walk(node: dict) -> None:
            labels = (self.pipeline, node["id"], node["kind"])
            up.add_metric(labels, 1.0 if node["state"] == "running" else 0.0)
            restarts.add_metric(labels, float(node.get("restarts", 0)))
            pid = node.get("pid")
            if pid:
                try:
                    proc = psutil.Process(pid)
                    with proc.oneshot():
                        rss.add_metric((self.pipeline, node["id"]),
                                       float(proc.memory_info().rss))
                        t = proc.cpu_times()
                        cpu.add_metric((self.pipeline, node["id"]), t.user + t.system)
                except psutil.Error:
                    pass
            for child in node.get("children", []):
                walk(child)

        walk(self.snapshot())
        yield from (up, restarts, rss, cpu)


def serve(listen: str, path: str, pipeline: str, snapshot: Callable[[], dict]) -> object:
    """Start the HTTP listener in a background thread; returns the server (``shutdown()``)."""
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=path)
    registry.register(TreeCollector(pipeline, snapshot))
    host, _, port = listen.rpartition(":")
    server, _thread = start_http_server(int(port), addr=host.strip("[]"), registry=registry)
    log.info("metrics on http://%s/metrics", listen)
    return server


def process_dead(pid: int, path: str) -> None:
    from prometheus_client import multiprocess

    try:
        multiprocess.mark_process_dead(pid, path)
    except OSError:
        pass
