"""Back-pressure under a stalled Spark: memory stays bounded, producers stop fetching.

    .venv/bin/python bench/backpressure.py [--messages 200000] [--stall 30] [--source rabbitmq]
                                           [--payload-bytes 100] [--json OUT]

A RabbitMQ queue is pre-loaded with ``--messages`` JSON messages (or, with ``--source
generator``, the generator source emits that many), and a daemon runs the full pipeline:
producer → 2 processors → one batcher (``batch_size`` 1000) → one batch processor → the
daemon's own local Spark Connect server (started and supervised by the daemon), Parquet.
Once the first rows are written (10 % of the messages acked), the Spark server's JVM is
SIGSTOPped for ``--stall`` seconds, then SIGCONTed: the most honest stall there is, since
the JVM neither answers nor refuses.  Every 0.5 s the bench samples:

* the RSS of every process of the daemon's tree (psutil), the Spark JVM apart and its
  short-lived children (forked shell commands that share its pages) apart again;
* from ``status``: the producer's in-flight count and buffer, its source's ``fetched`` and
  ``unacked``, the processors' output buffers, the batcher's partial and pending batches,
  the batch processor's written count, restarts anywhere in the tree;
* from the broker (``rabbitmqctl list_queues``, in its own thread: each call takes ~0.7 s):
  ``messages_ready`` and ``messages_unacknowledged``.

It reports peak tree RSS before / during / after the stall, whether the producer stopped
fetching (its ``fetched`` counter flat and the broker's ready count unchanged over the
stall once the pipeline had filled up, unacked never above the prefetch window), what
happened to the blocked write (retried, failed, the batch processor restarted), and after
the drain: rows in the dataset vs messages, duplicates, dead letters, the queue left.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
from offbroadway.daemon.config.names import role_of
from offbroadway.supervision.tree import snapshot_nodes

REPO = Path(__file__).resolve().parent.parent
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"

HANDLER = '''
import json
from offbroadway import Pipeline

class Rows(Pipeline):
    """RabbitMQ bodies are JSON bytes; the generator's data is a dict already."""

    def handle_message(self, processor, message, context):
        if isinstance(message.data, (bytes, bytearray)):
            message.update_data(json.loads)
        return message.put_batcher("spark")

    def handle_batch(self, batcher, messages, batch_info, context):
        return messages
'''


def write_config(tmp: Path, source: str, queue: str, messages: int, payload: int) -> Path:
    if source == "rabbitmq":
        options = f'url = "{AMQP_URL}"\nqueue = "{queue}"\nprefetch_count = "auto"\n' \
                  f'on_failure = "reject"'
    else:
        options = f"count = {messages}\npayload_bytes = {payload}"
    config = tmp / "bench.toml"
    config.write_text(f"""
[pipeline]
name = "backpressure"
handler = "bp_handler:Rows"
shutdown_timeout = 120

[producer]
source = "{source}"

[producer.options]
{options}

[processors.default]
concurrency = 2
max_demand = 50

[batchers.spark]
batch_size = 1000
batch_timeout = 1.0
concurrency = 1

[spark]
output = "{tmp}/dataset"
master = "local[2]"

[metrics]
listen = ""

[runtime]
dir = "{tmp}/run"
state_dir = "{tmp}/state"
""")
    return config


# -- the broker ---------------------------------------------------------------------------

def preload(queue: str, n: int, payload: int) -> None:
    """Declare ``queue`` (dead letters to ``<queue>.dlq``) and publish n messages."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    ch = conn.channel()
    ch.exchange_declare(f"{queue}.dlx", "fanout")
    ch.queue_declare(f"{queue}.dlq")
    ch.queue_bind(f"{queue}.dlq", f"{queue}.dlx")
    ch.queue_declare(queue, arguments={"x-dead-letter-exchange": f"{queue}.dlx"})
    pad = ("abcdefghijklmnopqrstuvwxyz0123456789" * (payload // 36 + 1))[:payload]
    for i in range(n):
        ch.basic_publish("", queue, json.dumps({"seq": i, "payload": pad}).encode(),
                         pika.BasicProperties(message_id=f"m{i}"))
    conn.process_data_events(time_limit=0)
    conn.close()


def queue_counts(queue: str) -> dict[str, int] | None:
    res = subprocess.run(["rabbitmqctl", "-q", "list_queues", "name", "messages_ready",
                          "messages_unacknowledged"], capture_output=True, text=True,
                         timeout=60, check=False)
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == queue:
            return {"ready": int(parts[1]), "unacked": int(parts[2])}
    return None


def cleanup_queues(queue: str) -> None:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    ch = conn.channel()
    for q in (queue, f"{queue}.dlq"):
        ch.queue_delete(q)
    ch.exchange_delete(f"{queue}.dlx")
    conn.close()


class BrokerSampler(threading.Thread):
    """``rabbitmqctl`` as often as it answers (each call takes most of a second)."""

    def __init__(self, queue: str, t0: float) -> None:
        super().__init__(daemon=True)
        self.queue, self.t0 = queue, t0
        self.samples: list[dict[str, Any]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            counts = queue_counts(self.queue)
            if counts is not None:
                self.samples.append({"t": time.monotonic() - self.t0, **counts})


# -- the daemon's tree ------------------------------------------------------------------------

def sample_status(tree: dict) -> dict[str, Any]:
    s: dict[str, Any] = {"inflight": 0, "producer_buffered": 0, "fetched": 0, "unacked": 0,
                         "acked": 0, "failed": 0, "processor_buffered": 0,
                         "batcher_buffered": 0, "batcher_pending": 0, "written": 0,
                         "restarts": 0, "prefetch": None}
    for n in snapshot_nodes(tree):
        s["restarts"] += n.get("restarts") or 0
        m = n.get("messages") or {}
        if role_of(n["id"]) == "producer":
            src = m.get("source") or {}
            s["inflight"] += m.get("inflight", 0)
            s["producer_buffered"] += m.get("buffered", 0) + (src.get("buffered") or 0)
            s["fetched"] += src.get("fetched", 0)
            s["unacked"] += src.get("unacked", 0)
            s["acked"] += m.get("acked", 0)
            s["failed"] += m.get("failed", 0)
            s["prefetch"] = src.get("prefetch_count")
        elif role_of(n["id"]) == "processor":
            s["processor_buffered"] += m.get("buffered", 0)
        elif role_of(n["id"]) == "batcher":
            s["batcher_buffered"] += m.get("buffered", 0)
            s["batcher_pending"] += m.get("pending_batches", 0)
        elif role_of(n["id"]) == "batch_processor":
            s["written"] += m.get("out", 0)
    return s


def tree_rss(root_pid: int) -> tuple[int, int, int, int | None, dict[int, int]]:
    """(RSS of the daemon and its descendants outside Spark's JVM, RSS of the JVM, RSS of
    the JVM's own children, JVM pid, pid → RSS of each process outside the JVM's subtree).

    The JVM's children are counted apart: Hadoop's local filesystem forks shell commands,
    and a forked JVM shows the parent's ~600 MB of shared pages as its RSS for the moment
    before it execs; summed, they would look like a tree growing by gigabytes."""
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0, 0, None, {}
    jvm_pid = None
    under_jvm: set[int] = set()
    for p in procs:
        try:
            if "java" in p.name():
                jvm_pid = p.pid
                under_jvm = {p.pid} | {c.pid for c in p.children(recursive=True)}
        except psutil.NoSuchProcess:
            continue
    rest = jvm = jvm_children = 0
    each: dict[int, int] = {}
    for p in procs:
        try:
            rss = p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
        if p.pid == jvm_pid:
            jvm = rss
        elif p.pid in under_jvm:
            jvm_children += rss
        else:
            rest += rss
            each[p.pid] = rss
    return rest, jvm, jvm_children, jvm_pid, each


def names_of(tree: dict | None, daemon_pid: int, jvm_pid: int | None) -> dict[int, str]:
    """pid → the tree's child id (the daemon itself, the JVM, else the pid's command)."""
    names = {daemon_pid: "daemon"}
    if jvm_pid:
        names[jvm_pid] = "spark JVM"
    for n in snapshot_nodes(tree or {}):
        if n.get("pid"):
            names[n["pid"]] = n["id"]
    return names


def count_rows(dataset: Path) -> tuple[int, int]:
    """(rows, distinct message ids) Spark committed under ``dataset``."""
    import pyarrow.parquet as pq

    path = dataset / "spark"
    if not path.exists():
        return 0, 0
    table = pq.read_table(path, columns=["message_id"])
    ids = table.column("message_id").to_pylist()
    return len(ids), len(set(ids))


# -- the run ----------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> dict[str, Any]:
    from offbroadway.daemon.cli import control

    tmp = Path(tempfile.mkdtemp(prefix="obbp-", dir="/tmp"))
    os.chmod(tmp, 0o700)
    (tmp / "bp_handler.py").write_text(HANDLER)
    queue = f"obbench-bp-{uuid.uuid4().hex[:8]}"
    if args.source == "rabbitmq":
        t = time.monotonic()
        preload(queue, args.messages, args.payload_bytes)
        print(f"published {args.messages} messages in {time.monotonic() - t:.1f} s",
              flush=True)
    config = write_config(tmp, args.source, queue, args.messages, args.payload_bytes)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp), str(REPO)]))
    err_path = tmp / "daemon.err"
    t0 = time.monotonic()
    with open(err_path, "w") as err:
        daemon = subprocess.Popen([sys.executable, "-m", "offbroadway.daemon.cli", "run",
                                   str(config), "--until-idle"], cwd=tmp, env=env,
                                  stdout=subprocess.PIPE, stderr=err, text=True)
    broker = BrokerSampler(queue, t0)
    if args.source == "rabbitmq":
        broker.start()
    sock = str(tmp / "run" / "control.sock")
    samples: list[dict[str, Any]] = []
    phase = "start"
    stall_at = resume_at = None
    jvm_pid = None
    stall_target = int(args.messages * 0.1)
    last: dict[str, Any] = {}
    names: dict[int, str] = {}
    try:
        while daemon.poll() is None and time.monotonic() - t0 < args.timeout:
            tick = time.monotonic()
            try:
                tree = control.request(sock, {"cmd": "status"}, timeout=5)["status"]["tree"]
                last = sample_status(tree)
            except (control.ControlError, OSError, ValueError, KeyError):
                tree = None
            rest, jvm, jvm_children, pid, each = tree_rss(daemon.pid)
            jvm_pid = pid or jvm_pid
            now = tick - t0
            if tree is not None:
                names.update(names_of(tree, daemon.pid, jvm_pid))
                by_name: dict[str, int] = {}
                for p, r in each.items():
                    name = names.get(p, "other")
                    by_name[name] = by_name.get(name, 0) + r
                samples.append({"t": now, "phase": phase, "rss": rest, "jvm_rss": jvm,
                                "jvm_children_rss": jvm_children, "by_process": by_name,
                                **last})
            if phase == "start" and last.get("acked", 0) > 0:
                phase = "before"
                print(f"{now:6.1f} s  first messages acked (Spark writing)", flush=True)
            elif phase == "before" and last.get("acked", 0) >= stall_target and jvm_pid:
                os.kill(jvm_pid, signal.SIGSTOP)
                stall_at, phase = time.monotonic(), "during"
                print(f"{now:6.1f} s  SIGSTOP Spark JVM {jvm_pid} "
                      f"({last['acked']} acked)", flush=True)
            elif phase == "during" and time.monotonic() - stall_at >= args.stall:
                os.kill(jvm_pid, signal.SIGCONT)
                resume_at, phase = time.monotonic(), "after"
                print(f"{now:6.1f} s  SIGCONT Spark JVM", flush=True)
            time.sleep(max(0.0, 0.5 - (time.monotonic() - tick)))
    finally:
        if jvm_pid and phase == "during":
            os.kill(jvm_pid, signal.SIGCONT)
        if daemon.poll() is None:
            daemon.kill()
        broker.stop.set()
    out = daemon.stdout.read() if daemon.stdout else ""
    code = daemon.wait()
    broker.join(5)
    rows, distinct = count_rows(tmp / "dataset")
    dead = left = None
    if args.source == "rabbitmq":
        counts = queue_counts(queue) or {}
        dlq = queue_counts(f"{queue}.dlq") or {}
        left, dead = counts.get("ready"), dlq.get("ready")
    err_text = err_path.read_text()
    result = summarize(args, samples, broker.samples, stall_at, resume_at, t0)
    result.update(exit_code=code, rows=rows, distinct_ids=distinct,
                  duplicates=rows - distinct, lost=args.messages - distinct - (dead or 0),
                  dead_lettered=dead, queue_left=left, stdout_tail=out[-500:],
                  spark_retries=err_text.count("Spark write attempt"),
                  failed_batches=err_text.count("message(s) failed"),
                  watchdog_kills=sum(err_text.count(w) for w in ("heartbeat", "watchdog")),
                  load_average=os.getloadavg())
    if args.source == "rabbitmq":
        cleanup_queues(queue)
    if args.keep:
        result["dir"] = str(tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return result


def summarize(args: argparse.Namespace, samples: list[dict], broker: list[dict],
              stall_at: float | None, resume_at: float | None, t0: float) -> dict[str, Any]:
    def peak(key: str, phase: str) -> int | None:
        vals = [s[key] for s in samples if s["phase"] == phase and s.get(key) is not None]
        return max(vals) if vals else None

    phases = ("before", "during", "after")
    res: dict[str, Any] = {
        "messages": args.messages, "stall_seconds": args.stall, "source": args.source,
        "prefetch": next((s["prefetch"] for s in samples if s.get("prefetch")), None),
        "peak_tree_rss_mb": {p: round((peak("rss", p) or 0) / 2**20, 1) for p in phases},
        "peak_jvm_rss_mb": {p: round((peak("jvm_rss", p) or 0) / 2**20, 1) for p in phases},
        "peak_jvm_children_rss_mb": {p: round((peak("jvm_children_rss", p) or 0) / 2**20, 1)
                                     for p in phases},
        "peak_inflight": {p: peak("inflight", p) for p in phases},
        "peak_source_unacked": {p: peak("unacked", p) for p in phases},
        "peak_processor_buffered": {p: peak("processor_buffered", p) for p in phases},
        "peak_batcher_buffered": {p: peak("batcher_buffered", p) for p in phases},
        "peak_batcher_pending": {p: peak("batcher_pending", p) for p in phases},
        "restarts": max((s["restarts"] for s in samples), default=0),
        "peak_rss_mb_by_process": {
            name: {p: round(max((s["by_process"].get(name, 0) for s in samples
                                 if s["phase"] == p), default=0) / 2**20, 1) for p in phases}
            for name in sorted({n for s in samples for n in s["by_process"]})},
    }
    if stall_at is not None and resume_at is not None:
        s0, s1 = stall_at - t0, resume_at - t0
        during = [s for s in samples if s0 <= s["t"] <= s1]
        # the pipeline keeps taking messages until every buffer is full: from the moment
        # the source's fetched counter stopped moving, nothing more may come in
        flat_from = None
        for i, s in enumerate(during):
            if all(x["fetched"] == s["fetched"] for x in during[i:]):
                flat_from = s["t"]
                break
        res["fetched_during_stall"] = (during[-1]["fetched"] - during[0]["fetched"]
                                       if during else None)
        res["fetched_flat_after_s"] = round(flat_from - s0, 1) if flat_from else None
        res["acked_during_stall"] = (during[-1]["acked"] - during[0]["acked"]
                                     if during else None)
        b_during = [b for b in broker if s0 <= b["t"] <= s1]
        if b_during:
            later = [b for b in b_during if flat_from is None or b["t"] >= flat_from]
            res["broker_during_stall"] = {
                "samples": len(b_during),
                "ready_first": b_during[0]["ready"], "ready_last": b_during[-1]["ready"],
                "ready_range_once_full": (min(b["ready"] for b in later),
                                          max(b["ready"] for b in later)) if later else None,
                "unacked_max": max(b["unacked"] for b in b_during)}
        res["broker_unacked_max_overall"] = max((b["unacked"] for b in broker), default=None)
        acked_after = [s for s in samples if s["t"] > s1 and s["acked"] > during[-1]["acked"]] \
            if during else []
        res["first_ack_after_resume_s"] = round(acked_after[0]["t"] - s1, 1) \
            if acked_after else None
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--stall", type=float, default=30.0, help="seconds the JVM is stopped")
    ap.add_argument("--source", choices=("rabbitmq", "generator"), default="rabbitmq")
    ap.add_argument("--payload-bytes", type=int, default=100)
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--json", help="write the result here too")
    ap.add_argument("--keep", action="store_true", help="keep the run's directory")
    args = ap.parse_args()
    result = run(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
