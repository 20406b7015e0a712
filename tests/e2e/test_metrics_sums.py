"""Metrics whose sums mean something, read from a running daemon's ``/metrics``.

* One role owns each count: ``messages_acked_total`` and ``messages_failed_total`` are the
  sources' books, exported by the producers alone, so a plain ``sum()`` is the number of
  messages (processors used to export ``acked 0`` forever and batch processors their own
  acks of the same messages, and ``sum()`` double-counted); where messages fail is
  ``stage_failed_messages_total``.
* One label name for a child on every metric: ``child`` (stage metrics used ``stage=``,
  the tree's ``child=``).
* ``handle_message_seconds`` counts messages, not frames: its ``_count`` is the number of
  messages handled and its ``_sum`` their total time.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections import defaultdict
from pathlib import Path

from offbroadway.supervision.tree import snapshot_nodes
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO, free_port, offbroadway_cmd, test_env, wait_until
from tests.e2e.test_operations import status
from tests.e2e.test_pipeline import make_config, stage_pids

N = 1000


def scrape(port: int) -> dict[str, list[tuple[dict, float]]]:
    """metric sample name -> [(labels, value)] of one scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, list[tuple[dict, float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("offbroadway_"):
                out[s.name].append((s.labels, s.value))
    return out


def total(samples: dict, name: str, **match: str) -> float:
    return sum(v for labels, v in samples.get(name, [])
               if all(labels.get(k) == want for k, want in match.items()))


def test_counts_have_one_owner_one_child_label_and_per_message_histograms(short_tmp: Path
                                                                          ) -> None:
    spool = short_tmp / "spool"
    spool.mkdir()
    port = free_port()
    config = make_config(short_tmp, batchers={"even": {"batch_size": 50, "batch_timeout": 0.2}})
    config.write_text(config.read_text().replace('listen = ""', f'listen = "127.0.0.1:{port}"'))
    sock = short_tmp / "run" / "control.sock"
    daemon = subprocess.Popen(offbroadway_cmd("run", str(config)), cwd=REPO, env=test_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: sock.exists() and len(stage_pids(sock)) == 5, timeout=60,
                   message="the daemon up")
        (spool / "a.jsonl").write_text("".join(
            json.dumps({"seq": i, "route": "even", "fail": i % 10 == 0}) + "\n"
            for i in range(N)))
        failing = N // 10

        def settled() -> int:
            return sum(n.get("messages", {}).get("acked", 0) +
                       n.get("messages", {}).get("failed", 0)
                       for n in snapshot_nodes(status(sock)["tree"])
                       if n["id"].startswith("producer_"))

        wait_until(lambda: settled() == N, timeout=60, message="every message settled")
        # stages publish once a tick: wait until every stage's last counts are in /metrics
        # (a deadline: books that never add up fail the test with what they said)
        books: dict[str, float] = {}

        def add_up() -> dict | None:
            s = scrape(port)
            books.update({
                "acked": total(s, "offbroadway_messages_acked_total"),
                "failed": total(s, "offbroadway_messages_failed_total"),
                "stage_failed": total(s, "offbroadway_stage_failed_messages_total"),
                "handled": total(s, "offbroadway_handle_message_seconds_count")})
            want = {"acked": N - failing, "failed": failing, "stage_failed": failing,
                    "handled": N}
            return s if books == want else None

        try:
            samples = wait_until(add_up, timeout=20, interval=0.3, message="the books")
        except AssertionError:
            raise AssertionError(f"/metrics says {books}") from None

        # one owner: a plain sum is the number of messages, and only producers export them
        assert total(samples, "offbroadway_messages_acked_total") == N - failing
        assert total(samples, "offbroadway_messages_failed_total") == failing
        for name in ("offbroadway_messages_acked_total", "offbroadway_messages_failed_total"):
            roles = {labels["role"] for labels, _ in samples[name]}
            assert roles == {"producer"}, (name, roles)
        # where they failed: the processors' handler, said by the stage that failed them
        assert total(samples, "offbroadway_stage_failed_messages_total",
                     role="processor") == failing
        assert total(samples, "offbroadway_stage_failed_messages_total") == failing

        # one label name for a child, on every metric that names one
        children = {n["id"] for n in snapshot_nodes(status(sock)["tree"])}
        for name, series in samples.items():
            for labels, _ in series:
                assert "stage" not in labels, (name, labels)
                if name.startswith(("offbroadway_child_", "offbroadway_messages_",
                                    "offbroadway_handle_", "offbroadway_batch")):
                    assert labels.get("child") in children, (name, labels)

        # handle_message is observed per message: its count is the messages handled
        assert total(samples, "offbroadway_handle_message_seconds_count") == N
        per_message = (total(samples, "offbroadway_handle_message_seconds_sum")
                       / total(samples, "offbroadway_handle_message_seconds_count"))
        assert 0 < per_message < 0.05, per_message
    finally:
        daemon.terminate()
        assert daemon.wait(60) == 0, daemon.stderr.read()[-3000:] if daemon.stderr else ""
