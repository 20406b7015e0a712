"""The multiprocess metrics dir stays bounded through any number of stage restarts, and
the counts a scrape returns are unchanged by it.

prometheus-client keeps every dead process's counter and histogram files (its docs: they
are summed); a daemon restarting stages for weeks would pile them up, and every scrape
reads them all.  The daemon folds a dead process's files into one archive per type
(``offbroadway.daemon.observe.metricsdir``).  These tests run real processes writing through the
stages' own metrics code, and a real daemon whose stages are restarted 200 times.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest
from offbroadway.daemon.observe import metrics
from offbroadway.supervision.tree import snapshot_nodes

from tests.conftest import REPO, free_port, test_env, wait_until

#: files a live stage process may have (counter, histogram, livesum gauge) ...
PER_PROCESS = 3
#: ... and the archives of the dead (counter, histogram; summary if a handler made one)
ARCHIVES = 3


def scrape(port: int) -> dict[tuple[str, str], float]:
    """(sample name, stage label) -> value summed over the other labels, from /metrics."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    out: dict[tuple[str, str], float] = defaultdict(float)
    for line in body.decode().splitlines():
        m = re.match(r'^(offbroadway_[a-z_]+)\{([^}]*)\} (\S+)$', line)
        # (the tree's and the daemon's own process series are not the stages' books)
        if m is None or m[1].startswith(("offbroadway_child_", "offbroadway_rate_limit",
                                         "offbroadway_daemon_")):
            continue
        stage = re.search(r'child="([^"]*)"', m[2])
        le = re.search(r'(?:^|,)le="([^"]*)"', m[2])
        key = m[1] + (f"[le={le[1]}]" if le else "")
        out[(key, stage[1] if stage else "")] += float(m[3])
    return dict(out)


def counter_like(sample: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """The samples that must never go down: counters and histograms (not gauges)."""
    return {k: v for k, v in sample.items()
            if k[0].endswith(("_total", "_count", "_sum")) or "_bucket" in k[0]}


def test_dead_processes_are_folded_into_archives_and_the_sums_hold(tmp_path: Path) -> None:
    """200 processes publish known counts through StageMetrics and exit, one after the
    other; the daemon's ``process_dead`` runs after each, while a thread scrapes /metrics
    as fast as it can.  The dir never holds more than the live process's files plus the
    archives, no scrape ever sees a counter go down (a compaction is atomic for a
    scrape), and the final sums are exactly what the 200 processes counted.  Before the
    archives, the dir held 2 files per process that ever lived (400 here)."""
    path = tmp_path / "metrics"
    path.mkdir(mode=0o700)
    port = free_port()
    server = metrics.serve(f"127.0.0.1:{port}", str(path), "p",
                           lambda: {"id": "root", "kind": "supervisor", "state": "running",
                                    "children": []})
    stop = threading.Event()
    problems: list[str] = []
    scrapes = [0]

    def scraper() -> None:
        last: dict[tuple[str, str], float] = {}
        while not stop.is_set():
            try:
                now = counter_like(scrape(port))
            except OSError as exc:
                problems.append(f"scrape failed: {exc}")
                return
            for key, value in last.items():
                if now.get(key, 0.0) < value:
                    problems.append(f"{key} went down: {value} -> {now.get(key)}")
            last = now
            scrapes[0] += 1

    n = 200
    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    most = 0
    try:
        child = subprocess.Popen([sys.executable, "-m", "tests.faults.metrics_child",
                                  str(path), str(n)], cwd=REPO, env=test_env(),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdin is not None
        for line in child.stdout:
            metrics.process_dead(int(line), str(path))
            most = max(most, len(os.listdir(path)))
            child.stdin.write("next\n")      # the next child starts after the compaction
            child.stdin.flush()
        child.stdin.close()
        assert child.wait(60) == 0
        wait_until(lambda: scrapes[0] >= 20, timeout=30, message="20 scrapes")
    finally:
        stop.set()
        thread.join(30)
        server.shutdown()
    assert not problems, problems[:5]
    assert most <= PER_PROCESS + ARCHIVES, most   # one process alive at a time
    assert {name for name in os.listdir(path)} == {"counter_archive.db",
                                                   "histogram_archive.db"}
    for name in os.listdir(path):
        assert os.stat(path / name).st_mode & 0o777 == 0o600, name

    # the sums: exactly what the processes counted, per stage
    from offbroadway.daemon.observe.metricsdir import CompactedCollector

    got: dict[tuple[str, str], float] = defaultdict(float)
    for family in CompactedCollector(str(path)).collect():
        for s in family.samples:
            if s.name.endswith("_bucket"):
                continue
            got[(s.name, s.labels.get("child", ""))] += s.value
    want: dict[tuple[str, str], float] = defaultdict(float)
    for i in range(n):
        stage = f"processor_default_{i % 3}"
        want[("offbroadway_messages_received_total", stage)] += i + 1
        want[("offbroadway_messages_processed_total", stage)] += i
        want[("offbroadway_stage_failed_messages_total", stage)] += 2 * i
        want[("offbroadway_batch_size_messages_count", stage)] += i % 5 + 1
        want[("offbroadway_batch_size_messages_sum", stage)] += i * (i % 5 + 1)
    for key, value in want.items():
        assert got.get(key) == value, (key, got.get(key), value)
    # the dead processes' gauges are gone, not summed forever
    assert not any(k[0].startswith(("offbroadway_demand", "offbroadway_buffered"))
                   and v for k, v in got.items()), got


def _one_dead_processor(tmp_path: Path) -> tuple[Path, int]:
    """A metrics dir, and the pid of a process that counted one message received in it
    as ``processor_default_0`` and exited."""
    path = tmp_path / "metrics"
    path.mkdir(mode=0o700)
    child = subprocess.run([sys.executable, "-m", "tests.faults.metrics_child", str(path), "1"],
                           cwd=REPO, env=test_env(), input="next\n", capture_output=True,
                           text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    return path, int(child.stdout.split()[0])


def _archived(path: Path) -> dict[tuple[str, str | None], float]:
    """(sample name, child) -> value, as a scrape of the dir's archives returns them."""
    from offbroadway.daemon.observe.metricsdir import CompactedCollector

    return {(s.name, s.labels.get("child")): s.value
            for family in CompactedCollector(str(path)).collect() for s in family.samples}


def test_what_a_dead_process_counted_after_its_last_flush_is_added(tmp_path: Path) -> None:
    """A stage SIGKILLed between flushes: the daemon adds what its tally says it counted
    after its last flush to the counters of that name in its files, once."""
    path, pid = _one_dead_processor(tmp_path)
    metrics.process_dead(pid, str(path), {"offbroadway_messages_received_total": 5,
                                          "offbroadway_messages_acked_total": 7})
    got = _archived(path)
    assert got[("offbroadway_messages_received_total", "processor_default_0")] == 1 + 5
    assert not any(name == "offbroadway_messages_acked_total" for name, _ in got)


def test_counts_learnt_after_a_death_are_credited_to_the_archived_series(
        tmp_path: Path) -> None:
    """Acks in doubt that landed are known only when the drain completes, long after the
    producer's files were folded: they go into its archived series, and only its."""
    from offbroadway.daemon.observe.metricsdir import credit

    path, pid = _one_dead_processor(tmp_path)
    metrics.process_dead(pid, str(path))
    assert credit(str(path), "offbroadway_messages_received_total", "processor_default_0", 4)
    assert not credit(str(path), "offbroadway_messages_received_total", "processor_default_1",
                      4)
    got = _archived(path)
    assert got[("offbroadway_messages_received_total", "processor_default_0")] == 1 + 4


def test_an_empty_file_of_a_dead_process_is_removed(tmp_path: Path) -> None:
    """A process killed while prometheus-client created its file can leave it empty; its
    compaction adds nothing and removes it (no error, no archive made for nothing)."""
    path = tmp_path / "metrics"
    path.mkdir()
    (path / "counter_999999.db").write_bytes(b"")
    metrics.process_dead(999999, str(path))
    assert os.listdir(path) == []


# -- the daemon: 200 restarts ------------------------------------------------------------------

HANDLER = '''
from offbroadway import Pipeline

class Noop(Pipeline):
    def handle_message(self, processor, message, context):
        return message.put_batcher("sink")

    def handle_batch(self, batcher, messages, batch_info, context):
        return messages
'''


def _status(sock: str) -> dict:
    from offbroadway.daemon.cli import control

    return control.request(sock, {"cmd": "status"}, timeout=30)["status"]


def _workers(tree: dict) -> dict[str, int]:
    return {node["id"]: node["pid"] for node in snapshot_nodes(tree)
            if node["kind"] == "worker" and node.get("pid")}


@pytest.mark.slow
def test_200_stage_restarts_keep_the_metrics_dir_bounded_and_the_counts(short_tmp: Path
                                                                        ) -> None:
    """A spool pipeline handles 2,000 lines and goes idle; then its stages are restarted
    200 times (SIGKILL and ``offbroadway restart``, one stage at a time, each waited for).
    Nothing flows meanwhile, so every counter and histogram /metrics shows must be exactly
    what it was before the restarts (none lost with a dead process, none counted twice),
    and the metrics dir must never hold more than 3 files per live stage plus the
    archives.  Before the archives: ~2 files per dead process, 400+ here (measured with
    every stage a victim alike: at most 12 files over 473 worker restarts)."""
    from offbroadway.daemon.cli import control

    from tests.e2e.test_pipeline import write_spool

    (short_tmp / "noop_soak.py").write_text(HANDLER)
    write_spool(short_tmp / "spool", 2000, files=4)
    port = free_port()
    config = short_tmp / "p.toml"
    config.write_text(f"""
[pipeline]
name = "restarts"
handler = "noop_soak:Noop"
max_restarts = 1000
max_seconds = 1.0

[producer]
source = "spool"
max_restarts = 1000
max_seconds = 1.0

[producer.options]
path = "{short_tmp / 'spool'}"

[processors.default]
concurrency = 2

[batchers.sink]
batch_size = 100
batch_timeout = 0.2

[metrics]
listen = "127.0.0.1:{port}"

[runtime]
dir = "{short_tmp / 'run'}"
state_dir = "{short_tmp / 'state'}"
""")
    env = test_env()
    env["PYTHONPATH"] = os.pathsep.join([str(short_tmp), env["PYTHONPATH"]])
    log = open(short_tmp / "daemon.log", "w")
    daemon = subprocess.Popen([sys.executable, "-m", "offbroadway.daemon.cli", "run",
                               str(config)], cwd=short_tmp, env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    sock = str(short_tmp / "run" / "control.sock")
    mdir = short_tmp / "run" / "metrics"
    try:
        wait_until(lambda: (scrape(port).get(("offbroadway_messages_acked_total",
                                              "producer_0")) or 0) >= 2000
                   if (short_tmp / "run" / "control.sock").exists() else False,
                   timeout=120, interval=0.5, message="2,000 lines acked")
        wait_until(lambda: not list((short_tmp / "spool").glob("*.jsonl")), timeout=60,
                   message="the spool settled")
        time.sleep(2.5)    # two stage ticks: the last counts are published
        before = counter_like(scrape(port))
        assert before[("offbroadway_messages_acked_total", "producer_0")] == 2000, before

        rng = __import__("random").Random(27)
        most = 0
        for i in range(200):
            workers = _workers(_status(sock)["tree"])
            # mostly the stages that restart alone (a processor takes its siblings and the
            # batchers along: four processes, slow to start on a busy machine)
            victim = rng.choice(sorted(workers) if i % 10 == 0 else
                                ["producer_0", "batch_processor_sink_0"])
            if i % 2:
                os.kill(workers[victim], signal.SIGKILL)
            else:
                control.request(sock, {"cmd": "restart", "child": victim}, timeout=60)
            # the victim back with a new pid, and the whole tree running
            wait_until(lambda v=victim, p=workers[victim]: (
                _workers(_status(sock)["tree"]).get(v) not in (None, p)
                and all(n["state"] == "running" for n in snapshot_nodes(_status(sock)["tree"]))),
                timeout=60, interval=0.05, message=f"{victim} restarted ({i})")
            live = len(_workers(_status(sock)["tree"]))
            files = os.listdir(mdir)
            most = max(most, len(files))
            assert len(files) <= PER_PROCESS * (live + 4) + ARCHIVES, (i, sorted(files))
        time.sleep(2.5)
        after = counter_like(scrape(port))
        restarts = sum(n.get("restarts", 0) for n in snapshot_nodes(_status(sock)["tree"])
                       if n["kind"] == "worker")
        assert restarts >= 200, restarts
        for key, value in before.items():
            assert after.get(key) == value, (key, value, after.get(key))
        print(f"\nmetrics dir: at most {most} files over 200 restarts "
              f"({restarts} worker restarts); {len(os.listdir(mdir))} at the end")
        os.kill(daemon.pid, signal.SIGTERM)
        assert daemon.wait(60) == 0
    except BaseException:
        print((short_tmp / "daemon.log").read_text()[-5000:])
        raise
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(30)
        log.close()
    text = (short_tmp / "daemon.log").read_text()
    assert "Traceback" not in text, text[-3000:]
    assert "cannot compact" not in text
