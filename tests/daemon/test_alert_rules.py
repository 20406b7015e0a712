"""The alerting rules shipped beside the Grafana dashboard are valid Prometheus rules
(``promtool check rules``), query only metrics the code exports, and fire when they should
(``promtool test rules``: a failure ratio of 10% alerts, one of 1% does not)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.daemon.test_metrics_docs import exported

RULES = REPO / "docs" / "grafana" / "offbroadway-alerts.yml"


@pytest.fixture
def promtool() -> str:
    tool = shutil.which("promtool") or "/usr/bin/promtool"
    if not os.access(tool, os.X_OK):
        if os.environ.get("OFFBROADWAY_REQUIRE_CI_TOOLS"):
            pytest.fail("promtool is not installed (CI installs Debian's prometheus)")
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    return tool


def test_promtool_checks_the_rules(promtool: str) -> None:
    out = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout, out.stdout


def test_the_rules_query_only_exported_metrics() -> None:
    used = set(re.findall(r"offbroadway_[a-z_]+", RULES.read_text()))
    assert used, "the rules query nothing"
    assert used <= exported(), used - exported()


SERIES = 'offbroadway_messages_{what}_total{{pipeline="orders",child="producer_0",role="producer"}}'


def test_the_failure_ratio_alert_fires_at_10_percent_not_at_1(promtool: str,
                                                               tmp_path: Path) -> None:
    def case(acked_per_min: int, failed_per_min: int, alerts: str) -> str:
        return f"""
  - interval: 1m
    input_series:
      - series: '{SERIES.format(what="acked")}'
        values: '0+{acked_per_min}x30'
      - series: '{SERIES.format(what="failed")}'
        values: '0+{failed_per_min}x30'
    alert_rule_test:
      - eval_time: 25m
        alertname: OffbroadwayFailureRatio
        exp_alerts:{alerts}
"""
    DESCRIPTION = ("More than 5% of the messages settled at the source failed for 10 minutes; "
                   "offbroadway_stage_failed_messages_total says which stage fails them, "
                   "the log the reasons.")
    fires = ("\n"
             "          - exp_labels: {severity: warning, pipeline: orders}\n"
             "            exp_annotations:\n"
             "              summary: \"orders: 10% of messages fail\"\n"
             f"              description: \"{DESCRIPTION}\"\n")
    spec = tmp_path / "alerts-test.yml"
    spec.write_text(f"rule_files: ['{RULES}']\nevaluation_interval: 1m\ntests:"
                    + case(90, 10, fires) + case(99, 1, " []"))
    out = subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
