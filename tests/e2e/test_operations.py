"""Operating a running daemon through the contract: status --json, restart, drain, resume,
stop, /metrics, and the errors an operator sees when something is off."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections import Counter
from pathlib import Path

from offbroadway.supervision.tree import snapshot_find, snapshot_nodes

from tests.conftest import (  # free_port: other tests import it from here too
    REPO,
    free_port,
    offbroadway_cmd,
    start_daemon,
    test_env,
    wait_until,
)
from tests.e2e.handlers import read_records
from tests.e2e.test_pipeline import make_config, stage_pids, write_spool


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(offbroadway_cmd(*args), cwd=REPO, env=test_env(), capture_output=True,
                          text=True, timeout=60)


def status(sock: Path) -> dict:
    out = cli("status", "--json", "--socket", str(sock))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_status_restart_drain_resume_stop_and_metrics(short_tmp: Path) -> None:
    n, late = 6000, 500
    write_spool(short_tmp / "spool", n, files=2)
    port = free_port()
    config = make_config(short_tmp, context={"slow": 0.001}, batchers={
        "even": {"batch_size": 100, "batch_timeout": 0.5},
        "odd": {"batch_size": 100, "batch_timeout": 0.5}})
    config.write_text(config.read_text().replace('listen = ""', f'listen = "127.0.0.1:{port}"'))
    sock = short_tmp / "run" / "control.sock"
    out = short_tmp / "out"
    daemon = start_daemon(config)
    try:
        wait_until(sock.exists, timeout=30, message="the control socket")
        assert oct(sock.stat().st_mode & 0o777) == "0o600"
        assert oct((short_tmp / "run").stat().st_mode & 0o777) == "0o700"
        tree = wait_until(lambda: (s := status(sock)) and all(
            n["state"] == "running" for n in snapshot_nodes(s["tree"])) and s, timeout=30,
            message="every child running")
        assert tree["pipeline"] == "e2e"
        ids = {node["id"]: node for node in snapshot_nodes(tree["tree"])}
        for wid in ("producer_0", "processor_default_0", "processor_default_1", "batcher_even",
                    "batch_processor_even_0", "batcher_odd", "terminator"):
            assert ids[wid]["kind"] == "worker"
        assert ids["terminator"]["pid"] is None
        assert ids["ProcessorSupervisor"]["strategy"] == "one_for_all"
        assert set(ids["PipelineSupervisor"]) == {"id", "kind", "strategy", "pid", "state",
                                                  "restarts", "children"}

        # restart a worker: it comes back with a new pid and its restart is counted
        wait_until(lambda: len(read_records(str(out), "batch-")) >= 500, timeout=60,
                   message="messages to flow")
        before = stage_pids(sock)
        assert cli("restart", "batcher_odd", "--socket", str(sock)).returncode == 0
        after = wait_until(lambda: (p := stage_pids(sock)).get("batcher_odd") not in (
            None, before["batcher_odd"]) and p, timeout=30, message="batcher_odd restarted")
        assert after["producer_0"] == before["producer_0"]
        # unknown ids are an error that names the id
        bad = cli("restart", "no_such_child", "--socket", str(sock))
        assert bad.returncode == 1 and "no_such_child" in bad.stderr

        # drain: fetching stops, everything in flight is finished, the daemon stays up
        assert cli("drain", "--socket", str(sock)).returncode == 0

        def settled() -> bool:
            s = status(sock)
            producer = snapshot_find(s["tree"], "producer_0")
            return producer.get("messages", {}).get("inflight") == 0

        wait_until(settled, timeout=60, message="in-flight messages to settle after drain")
        handled = len(read_records(str(out), "batch-"))
        assert daemon.poll() is None
        # work that arrives while drained waits for the resume (on a fast run the first
        # n may all be done by now, so resume must be shown on lines that are certainly new)
        late_lines = [json.dumps({"seq": n + i, "route": "even" if i % 2 == 0 else "odd",
                                  "key": i % 3}) for i in range(late)]
        (short_tmp / "spool" / "part-late.jsonl").write_text("\n".join(late_lines) + "\n")

        def fetched() -> int:
            producer = snapshot_find(status(sock)["tree"], "producer_0")
            return producer["messages"]["source"]["fetched"]

        # nothing is fetched while drained: over two of the spool's rescans (1 s each) and
        # a stats tick, the source's fetched count and the handled records stand still
        before = fetched()
        time.sleep(3.0)   # a window in which nothing may happen, not a wait for something
        assert fetched() == before, "the drained producer fetched"
        assert len(read_records(str(out), "batch-")) == handled
        late_ids = {f"part-late.jsonl:{i + 1}" for i in range(late)}
        assert not late_ids & {r["id"] for r in read_records(str(out), "batch-")}
        assert cli("resume", "--socket", str(sock)).returncode == 0
        wait_until(lambda: late_ids <= {r["id"] for r in read_records(str(out), "batch-")},
                   timeout=30, message="resume to fetch every late line")

        # /metrics on localhost, with the documented names
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        text = body.decode()
        for name in ("offbroadway_messages_received_total", "offbroadway_messages_acked_total",
                     "offbroadway_child_up", "offbroadway_child_restarts_total",
                     "offbroadway_child_resident_memory_bytes", "offbroadway_inflight_messages",
                     "offbroadway_handle_message_seconds_bucket"):
            assert name in text, name
        assert 'offbroadway_child_restarts_total{child="batcher_odd"' in text.replace(
            'pipeline="e2e",', "")

        assert cli("stop", "--socket", str(sock)).returncode == 0
        assert daemon.wait(60) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
    # nothing lost across the restart, the drain and the stop: a second run finishes the rest
    proc = subprocess.run(offbroadway_cmd("run", str(config), "--until-idle"), cwd=REPO,
                          env=test_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = Counter(r["id"] for r in read_records(str(out), "batch-"))
    assert len(counts) == n + late


def test_cli_errors_without_a_daemon(short_tmp: Path) -> None:
    out = cli("status", "--socket", str(short_tmp / "nothing.sock"))
    assert out.returncode == 1
    assert "no offbroadway daemon is running" in out.stderr


def test_refuses_a_runtime_dir_others_can_write(short_tmp: Path) -> None:
    write_spool(short_tmp / "spool", 10, files=1)
    config = make_config(short_tmp)
    (short_tmp / "run").mkdir(mode=0o777)
    (short_tmp / "run").chmod(0o777)
    proc = subprocess.run(offbroadway_cmd("run", str(config), "--until-idle"), cwd=REPO,
                          env=test_env(), capture_output=True, text=True, timeout=60)
    # refused by the checks run shares with `check` (exit 2, naming runtime.dir), before
    # anything is created; the daemon's own refusal at start stays as a second guard
    assert proc.returncode == 2
    assert "runtime.dir" in proc.stderr and "writable by group/others" in proc.stderr
