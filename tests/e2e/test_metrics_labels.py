"""The labels of the series a running daemon serves are the ones docs/metrics.md names:
``kind`` on every per-child series (CPU and memory included), no ``batcher`` on the
processors' ``handle_message_seconds``, and the daemon's own CPU, memory and build
info beside the children's."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from offbroadway import __version__
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import free_port, start_daemon, wait_until
from tests.e2e.test_pipeline import make_config, write_spool


def scrape(port: int) -> dict[str, list]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    return {f.name: f.samples for f in text_string_to_metric_families(body.decode())}


def test_series_carry_the_documented_labels(short_tmp: Path) -> None:
    write_spool(short_tmp / "spool", 500, files=1)
    port = free_port()
    config = make_config(short_tmp, batchers={"even": {"batch_size": 50},
                                              "odd": {"batch_size": 50}})
    config.write_text(config.read_text().replace('listen = ""', f'listen = "127.0.0.1:{port}"'))
    daemon = start_daemon(config)
    try:
        # the processors' figures are published once a second once they handled messages
        families = wait_until(lambda: (f := _try(port)) and f.get(
            "offbroadway_handle_message_seconds") and f.get(
                "offbroadway_handle_batch_seconds") and len(f.get(
                "offbroadway_child_cpu_seconds", ())) >= 7 and f, timeout=60,
            message="handle_message_seconds and every stage's CPU served")
        for name in ("offbroadway_child_cpu_seconds", "offbroadway_child_resident_memory_bytes"):
            samples = families[name]
            assert samples and all(s.labels.get("kind") == "worker" for s in samples), samples
            assert {s.labels["child"] for s in samples} >= {"producer_0", "batcher_even"}
        hm = families["offbroadway_handle_message_seconds"]
        assert hm and all("batcher" not in s.labels for s in hm), hm[:3]
        assert all(s.labels.get("batcher") for s in families["offbroadway_handle_batch_seconds"])
        (info,) = families["offbroadway_build_info"]
        assert info.value == 1 and info.labels["version"] == __version__
        assert info.labels["pipeline"] == "e2e" and info.labels["python"]
        (rss,) = families["offbroadway_daemon_resident_memory_bytes"]
        assert 10 * 2**20 < rss.value < 2**30
        (cpu,) = families["offbroadway_daemon_cpu_seconds"]
        assert cpu.name == "offbroadway_daemon_cpu_seconds_total" and cpu.value > 0
    finally:
        daemon.terminate()
        daemon.wait(60)


def _try(port: int) -> dict[str, list] | None:
    try:
        return scrape(port)
    except OSError:
        return None
