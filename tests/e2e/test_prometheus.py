"""A real Prometheus server (Debian's ``prometheus``) scrapes the daemon: after a run with
known failures and one operator restart, its query API returns exactly the counts the
test caused: messages received, acked and failed, batches handled, restarts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from offbroadway.supervision.tree import snapshot_nodes

from tests.conftest import REPO, offbroadway_cmd, test_env, wait_until
from tests.e2e.handlers import read_records
from tests.e2e.test_operations import cli, free_port, status
from tests.e2e.test_pipeline import make_config, stage_pids

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def write_orders(spool: Path, name: str, first: int, n: int) -> int:
    """``n`` lines, every tenth failing on purpose; returns how many fail."""
    tmp = spool / f".{name}.tmp"
    tmp.write_text("".join(json.dumps({"seq": i, "route": "even", "fail": i % 10 == 0}) + "\n"
                           for i in range(first, first + n)))
    tmp.rename(spool / name)         # the spool picks up whole files only
    return sum(1 for i in range(first, first + n) if i % 10 == 0)


class Prometheus:
    def __init__(self, workdir: Path, target_port: int) -> None:
        self.port = free_port()
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: offbroadway\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{target_port}']\n")
        self.log = open(workdir / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def query(self, expr: str) -> dict | None:
        """``{labels: value}`` of an instant query, or None while the server is not up."""
        url = (f"http://127.0.0.1:{self.port}/api/v1/query?"
               + urllib.parse.urlencode({"query": expr}))
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                body = json.load(r)
        except OSError:
            return None
        assert body["status"] == "success", body
        return {json.dumps(s["metric"], sort_keys=True): float(s["value"][1])
                for s in body["data"]["result"]}

    def scalar(self, expr: str) -> float | None:
        result = self.query(expr)
        return next(iter(result.values())) if result else None

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


@pytest.fixture
def prometheus_bin() -> str:
    if not os.access(PROMETHEUS, os.X_OK):
        if os.environ.get("OFFBROADWAY_REQUIRE_CI_TOOLS"):
            pytest.fail("prometheus is not installed (CI installs Debian's package)")
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    return PROMETHEUS


def test_a_prometheus_server_reads_what_the_run_did(short_tmp: Path, prometheus_bin: str
                                                    ) -> None:
    spool = short_tmp / "spool"
    spool.mkdir()
    port = free_port()
    config = make_config(short_tmp, batchers={"even": {"batch_size": 50, "batch_timeout": 0.2}})
    config.write_text(config.read_text().replace('listen = ""', f'listen = "127.0.0.1:{port}"'))
    sock = short_tmp / "run" / "control.sock"
    daemon = subprocess.Popen(offbroadway_cmd("run", str(config)), cwd=REPO, env=test_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    prom = Prometheus(short_tmp, port)

    def settled() -> int:
        return sum(n.get("messages", {}).get("acked", 0) + n.get("messages", {}).get("failed", 0)
                   for n in snapshot_nodes(status(sock)["tree"]) if n["id"].startswith("producer_"))

    try:
        wait_until(lambda: sock.exists() and len(stage_pids(sock)) == 5, timeout=60,
                   message="the daemon up")
        failing = write_orders(spool, "a.jsonl", 0, 1000)
        wait_until(lambda: settled() == 1000, timeout=60, message="the first 1000 settled")
        # one operator restart, with nothing in flight (so nothing is delivered twice)
        before = stage_pids(sock)
        assert cli("restart", "processor_default_0", "--socket", str(sock)).returncode == 0
        wait_until(lambda: (now := stage_pids(sock)) and all(
            now.get(k) not in (None, before[k]) for k in ("processor_default_0",
                                                          "processor_default_1")),
                   timeout=30, message="both processors restarted (one_for_all)")
        failing += write_orders(spool, "b.jsonl", 1000, 1000)
        wait_until(lambda: settled() == 2000, timeout=60, message="all 2000 settled")
        # the operator restart causes the cascade a crash of processor_default_0 would: its
        # one_for_all siblings, and under the rest_for_one root everything after them
        tree = status(sock)["tree"]
        restarts = {n["id"]: n["restarts"] for n in snapshot_nodes(tree) if n["restarts"]}
        assert restarts.get("processor_default_0") == restarts.get("processor_default_1") == 1
        assert set(restarts.values()) == {1} and "producer_0" not in restarts, restarts
        workers = sum(1 for n in snapshot_nodes(tree)
                      if n["id"] in restarts and n["kind"] == "worker")
        records = read_records(str(short_tmp / "out"), "batch-")
        batches = sum(1 / r["size"] for r in records)       # a batch of s writes s records
        assert len(records) == 2000 - failing and abs(batches - round(batches)) < 1e-6

        expected = {
            'sum(offbroadway_messages_received_total{role="producer"})': 2000,
            'sum(offbroadway_messages_acked_total{role="producer"})': 2000 - failing,
            'sum(offbroadway_messages_failed_total{role="producer"})': failing,
            'sum(offbroadway_batches_total{role="batch_processor"})': round(batches),
            'sum(offbroadway_child_restarts_total{kind="worker"})': workers,
            'sum(offbroadway_child_restarts_total)': len(restarts),
            'offbroadway_child_restarts_total{child="processor_default_0"}': 1,
            'offbroadway_child_restarts_total{child="producer_0"}': 0,
            'up{job="offbroadway"}': 1,
        }
        seen: dict[str, float | None] = {}

        def agrees() -> bool:
            seen.update({q: prom.scalar(q) for q in expected})
            return seen == expected

        try:
            wait_until(agrees, timeout=60, interval=0.5, message="Prometheus to agree")
        except AssertionError:
            raise AssertionError(f"Prometheus says {seen}, the run did {expected}") from None
    finally:
        prom.stop()
        daemon.terminate()
        assert daemon.wait(60) == 0
