"""The metric names the docs and the Grafana dashboard use are the ones the code exports."""

from __future__ import annotations

import json
import re

from offbroadway.stages.runtime.metrics import (
    COUNTERS,
    GAUGES,
    HISTOGRAMS,
    SOURCE_COUNTERS,
    STAGE_FAILED,
)

from tests.conftest import REPO

DAEMON_METRICS = {"offbroadway_child_up", "offbroadway_child_restarts_total",
                  "offbroadway_child_resident_memory_bytes", "offbroadway_child_cpu_seconds_total",
                  "offbroadway_rate_limit_allowed_messages",
                  "offbroadway_rate_limit_interval_seconds",
                  "offbroadway_rate_limit_throttled_total",
                  "offbroadway_daemon_resident_memory_bytes",
                  "offbroadway_daemon_cpu_seconds_total", "offbroadway_build_info"}


def exported() -> set[str]:
    names = {n for n, _ in (*COUNTERS.values(), *SOURCE_COUNTERS.values(), STAGE_FAILED,
                            *GAUGES.values())}
    for name, _help, _buckets in HISTOGRAMS.values():
        names |= {name, f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names | DAEMON_METRICS


def test_dashboard_queries_only_exported_metrics() -> None:
    dashboard = json.loads((REPO / "docs/grafana/offbroadway.json").read_text())
    used = {name for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"offbroadway_[a-z_]+", target["expr"])}
    assert used, "the dashboard queries nothing"
    assert used <= exported(), used - exported()


def test_every_exported_metric_is_documented() -> None:
    doc = (REPO / "docs/metrics.md").read_text()
    missing = {n for n in exported() if not n.endswith(("_bucket", "_sum", "_count"))
               and f"`{n}`" not in doc}
    assert not missing, missing
