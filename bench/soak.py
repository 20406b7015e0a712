"""Soak: RabbitMQ → pipeline → Spark at a steady rate for a long time, with faults on a
timetable, sampling everything that could grow.

    .venv/bin/python bench/soak.py --minutes 60 --rate 5000
    .venv/bin/python bench/soak.py --minutes 5 --kill-every 20 --restart-every 60 \\
        --jvm-every 150 --rate 1000                      # every fault in five minutes

A daemon under systemd runs for weeks through stage crashes, operator restarts, reloads
and Spark JVM deaths.  A chaos run (bench/chaos.py) shows that nothing is lost while it
happens; this shows that nothing *grows* while it happens: memory, file descriptors, the
metrics dir, the runtime and state dirs, the time a scrape takes, the log's rate.

What one run does:

1. A fresh RabbitMQ queue (with a dead-letter queue, so a failed message shows instead of
   vanishing), a config with the ``rabbitmq`` source, processors, one ``spark`` batcher
   and the daemon's own local Spark writing Parquet outside the state dir, metrics on a
   free port, and the daemon started on it.
2. A publisher thread publishes ``--rate`` messages per second, ``{"uid": i}`` with
   ``message_id`` ``s<i>``, in slices every 100 ms.
3. On the timetable (each counted from the start): every ``--kill-every`` seconds a
   random stage (producer, processor, batcher, batch processor) is SIGKILLed, within the
   supervisors' intensity (``chaos.KillBudget`` and ``chaos.eligible``: a kill waits until
   what it would restart runs); every ``--restart-every`` an operator ``restart`` of a
   random worker; every ``--reload-every`` a ``reload`` that changes the batch timeout (a
   live change, so the reload does work); every ``--jvm-every`` a SIGKILL of the Spark
   JVM.
4. Every ``--sample-every`` seconds: RSS and open fds of each stage (by child id, across
   its incarnations), of the daemon and of the JVM; files and bytes in the metrics dir,
   the runtime dir and the state dir; the time a ``/metrics`` scrape takes; the daemon
   log's lines per minute since the last sample; the books so far.
5. At the end: the publisher stops, the queue drains (nothing ready or unacked), the
   daemon gets SIGTERM (exit 0 expected), and the dataset is read back with pyarrow.

It prints, for each series, the least-squares slope per hour with its standard error,
and the books: published, written (rows), acked (the daemon's total), lost (published ids
not in the dataset), duplicated (rows beyond one per id), dead-lettered.  ``--json``
writes everything (samples included).  The yardsticks in ../shared/bench sit beside the
repository; this needs none of them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import chaos
from benchlib import free_port, wait_alive
from offbroadway.supervision.tree import snapshot_find, snapshot_nodes

REPO = Path(__file__).resolve().parent.parent
KILL_KINDS = ("producer", "processor", "batcher", "batch_processor")

HANDLER = '''
import json

from offbroadway import Message, Pipeline


class Soak(Pipeline):
    def handle_message(self, processor, message: Message, context) -> Message:
        data = json.loads(message.data)
        return message.update_data(lambda _: {"uid": int(data["uid"])}).put_batcher("spark")
'''


@dataclass
class SoakOptions:
    minutes: float = 60.0
    rate: int = 5000                 # messages published per second
    kill_every: float = 60.0         # a random stage SIGKILLed
    restart_every: float = 300.0     # an operator restart of a random worker
    reload_every: float = 300.0      # a reload that changes the batch timeout
    jvm_every: float = 900.0         # the Spark JVM SIGKILLed
    sample_every: float = 10.0
    seed: int | None = None
    producers: int = 1
    processors: int = 2
    batch_processors: int = 1
    batch_size: int = 1000
    batch_timeout: float = 1.0
    payload: int = 64
    master: str = "local[2]"
    driver_memory: str = "1g"
    #: a Spark JVM restart takes 30-240 s on a busy machine: batches wait for it rather
    #: than fail (the default 60 s would dead-letter them)
    write_retry_seconds: float = 1800.0
    settle_timeout: float = 900.0    # after the publisher stops, for the queue to drain
    workdir: str | None = None
    keep: bool = False
    #: "HH:MM" (local time): the faults and the publishing end then at the latest, so a
    #: run started late still drains and reports before a deadline (SIGUSR1 ends them now)
    stop_at: str = ""


@dataclass
class Event:
    at: float
    what: str          # kill | restart | reload | jvm
    target: str
    detail: str = ""


@dataclass
class Sample:
    at: float                          # seconds since the start
    values: dict[str, float] = field(default_factory=dict)


# -- the pure part: slopes --------------------------------------------------------------------

def slope(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares slope of (x, y) and its standard error (0 with fewer than 3 points
    or no spread in x)."""
    n = len(points)
    if n < 3:
        return 0.0, 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0, 0.0
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    a = my - b * mx
    resid = sum((y - a - b * x) ** 2 for x, y in points)
    se = math.sqrt(resid / (n - 2) / sxx)
    return b, se


#: series prefix → (unit, the slope per hour that counts as growth, why).  A slope is
#: "flat" when it is within this threshold or within two standard errors of zero.
THRESHOLDS: dict[str, tuple[str, float, str]] = {
    "rss": ("MiB", 2.0, "a leak of one byte per message at 5k msg/s is 17 MiB/h; 2 MiB/h "
            "is the sampling noise of a stage's RSS across restarts here"),
    "fds": ("fds", 1.0, "a leaked descriptor per restart cycle would climb by tens per hour"),
    "files": ("files", 1.0, "a file left per restart would climb by tens per hour"),
    "bytes": ("MiB", 1.0, "state that grows with restarts, not with data"),
    "scrape": ("ms", 5.0, "a scrape reading one file more per restart would climb steadily"),
    "log": ("lines/min", 5.0, "log lines per minute come from the fault timetable, which is "
            "periodic"),
}


def threshold_for(name: str) -> tuple[str, float]:
    kind = name.split(":", 1)[0].split("_", 1)[0]
    if name.endswith("_bytes"):
        kind = "bytes"
    elif name.endswith("_files"):
        kind = "files"
    unit, limit, _ = THRESHOLDS.get(kind, ("", float("inf"), ""))
    return unit, limit


def scale_of(name: str) -> float:
    """Divisor from the sampled unit to the reported one (bytes → MiB)."""
    return 2**20 if name.startswith("rss:") or name.endswith("_bytes") else 1.0


def slopes(samples: list[Sample], skip: float = 0.0) -> dict[str, dict[str, float]]:
    """Per series: first, last, mean, min, max, slope per hour, its standard error, and
    whether it is flat (see THRESHOLDS); samples before ``skip`` seconds are left out
    (the start: JVM warm-up, first imports)."""
    series: dict[str, list[tuple[float, float]]] = {}
    for s in samples:
        if s.at < skip:
            continue
        for k, v in s.values.items():
            if k.startswith("book:"):
                continue
            series.setdefault(k, []).append((s.at / 3600.0, v / scale_of(k)))
    out = {}
    for name, pts in sorted(series.items()):
        b, se = slope(pts)
        unit, limit = threshold_for(name)
        ys = [y for _, y in pts]
        out[name] = {"unit": unit, "n": len(pts), "first": ys[0], "last": ys[-1],
                     "mean": sum(ys) / len(ys), "min": min(ys), "max": max(ys),
                     "slope_per_hour": b, "stderr": se, "threshold": limit,
                     "flat": abs(b) <= limit or abs(b) <= 2 * se}
    return out


# -- the machine side ----------------------------------------------------------------------

def dir_figures(path: Path) -> tuple[int, int]:
    """(files, bytes) under ``path``, recursively (sockets and fifos count as files)."""
    files = size = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            files += 1
            size += st.st_size
    return files, size


def proc_figures(pid: int) -> tuple[int, int] | None:
    """(RSS bytes, open fds) of a live process, or None."""
    try:
        p = psutil.Process(pid)
        return p.memory_info().rss, p.num_fds()
    except psutil.Error:
        return None


def jvm_of(spark_pid: int) -> int | None:
    try:
        for c in psutil.Process(spark_pid).children(recursive=True):
            if "java" in c.name():
                return c.pid
    except psutil.Error:
        return None
    return None


class Publisher(threading.Thread):
    """Publishes ``rate`` messages per second in slices every 100 ms, on its own
    connection; behind schedule it catches up by at most one second's worth."""

    def __init__(self, url: str, queue: str, rate: int, payload: int) -> None:
        super().__init__(name="publisher", daemon=True)
        self.url, self.queue, self.rate = url, queue, rate
        self.pad = "x" * payload
        self.published = 0
        self.errors: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        import pika

        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        ch = conn.channel()
        t0 = time.monotonic()
        try:
            while not self._halt.is_set():
                due = int((time.monotonic() - t0) * self.rate)
                due = min(due, self.published + self.rate)
                for i in range(self.published, due):
                    ch.basic_publish("", self.queue,
                                     json.dumps({"uid": i, "pad": self.pad}).encode(),
                                     pika.BasicProperties(message_id=f"s{i}"))
                self.published = max(self.published, due)
                conn.process_data_events(0)
                self._halt.wait(0.1)
        except Exception as exc:   # reported in the books, never silent
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            try:
                conn.close()
            except Exception:
                pass

    def stop(self) -> None:
        self._halt.set()
        self.join(60)


# -- the run ----------------------------------------------------------------------------------

class SoakAbort(RuntimeError):
    pass


class Soak:
    def __init__(self, opts: SoakOptions, say: Callable[[str], None] = print) -> None:
        self.opts = opts
        self.say = say
        self.rng = random.Random(opts.seed)
        self.events: list[Event] = []
        self.samples: list[Sample] = []
        self.problems: list[str] = []
        self.proc: subprocess.Popen | None = None
        self._log_lines = 0
        self._log_at = 0.0
        self._timeout_flip = False

    # -- set-up ------------------------------------------------------------------------------
    def setup(self) -> None:
        o = self.opts
        if o.workdir:
            self.tmp = Path(o.workdir)
            self.tmp.mkdir(parents=True, exist_ok=True)
        else:
            self.tmp = Path(tempfile.mkdtemp(prefix="obs-", dir="/tmp"))
        os.chmod(self.tmp, 0o700)
        (self.tmp / "soak_handler.py").write_text(HANDLER)
        self.run_dir, self.state_dir = self.tmp / "run", self.tmp / "state"
        self.sock = str(self.run_dir / "control.sock")
        self.dataset = self.tmp / "dataset"
        self.port = free_port()
        self.rabbit = chaos.RabbitSide()
        self.rabbit.queue = f"obsoak-{uuid.uuid4().hex[:10]}"
        self.rabbit.dlx, self.rabbit.dlq = f"{self.rabbit.queue}.dlx", f"{self.rabbit.queue}.dlq"
        self.rabbit.create()
        self.config = self.tmp / "soak.toml"
        self.write_config(o.batch_timeout)
        self.root = chaos.spec_tree(str(self.config))
        self.budget = chaos.KillBudget(self.root)
        self.log_path = self.tmp / "daemon.log"

    def write_config(self, batch_timeout: float) -> None:
        o = self.opts
        self.config.write_text(f"""
[pipeline]
name = "soak"
handler = "soak_handler:Soak"
shutdown_timeout = 30

[producer]
source = "rabbitmq"
concurrency = {o.producers}

[producer.options]
url = {json.dumps(chaos.AMQP_URL)}
queue = {json.dumps(self.rabbit.queue)}
on_failure = "reject"

[processors.default]
concurrency = {o.processors}

[batchers.spark]
batch_size = {o.batch_size}
batch_timeout = {batch_timeout}
concurrency = {o.batch_processors}

[spark]
output = {json.dumps(str(self.dataset))}
schema = "uid BIGINT"
master = {json.dumps(o.master)}
driver_memory = {json.dumps(o.driver_memory)}
write_retry_seconds = {o.write_retry_seconds}

[metrics]
listen = "127.0.0.1:{self.port}"

[runtime]
dir = "{self.run_dir}"
state_dir = "{self.state_dir}"
""")

    def start_daemon(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.tmp), str(REPO),
                                                          env.get("PYTHONPATH")]))
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "offbroadway.daemon.cli", "run", str(self.config)],
                cwd=self.tmp, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL)
        t = time.monotonic()
        self.wait_for("the tree to be up", lambda: (s := self.status()) and chaos.all_running(s),
                      timeout=600)
        self.say(f"soak: daemon (pid {self.proc.pid}) up in {time.monotonic() - t:.1f}s; "
                 f"work dir {self.tmp}")

    # -- talking to the daemon ---------------------------------------------------------------
    def status(self) -> dict | None:
        from offbroadway.daemon.cli import control

        try:
            reply = control.request(self.sock, {"cmd": "status"}, timeout=30)
        except (control.ControlError, OSError, ValueError):
            return None
        return reply.get("status") if reply.get("ok") else None

    def command(self, payload: dict, timeout: float = 120) -> dict:
        from offbroadway.daemon.cli import control

        try:
            return control.request(self.sock, payload, timeout=timeout)
        except control.ControlError as exc:
            return {"ok": False, "error": str(exc)}

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_for(self, what: str, predicate: Callable[[], Any], timeout: float,
                 interval: float = 0.5) -> Any:
        return wait_alive(what, predicate, timeout, interval, self.proc, SoakAbort)

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- faults ------------------------------------------------------------------------------
    def kill_stage(self) -> bool:
        """SIGKILL a random stage whose cascade runs and whose supervisor has budget;
        False when none is eligible yet (tried again shortly)."""
        status = self.status()
        if status is None or not chaos.all_running(status):
            return False
        now = self.now()
        by_kind = chaos.eligible(status, self.root, KILL_KINDS)
        candidates = [n for nodes in by_kind.values() for n in nodes
                      if self.budget.allows(n["id"], now)]
        if not candidates:
            return False
        node = self.rng.choice(sorted(candidates, key=lambda n: n["id"]))
        try:
            os.kill(int(node["pid"]), signal.SIGKILL)
        except ProcessLookupError:
            return False
        self.budget.record(node["id"], now)
        self.events.append(Event(round(now, 1), "kill", node["id"], f"pid {node['pid']}"))
        return True

    def restart(self) -> bool:
        status = self.status()
        if status is None or not chaos.all_running(status):
            return False
        workers = sorted(n["id"] for n in snapshot_nodes(status["tree"])
                         if n["kind"] == "worker" and n["id"] != "spark" and n.get("pid"))
        target = self.rng.choice(workers)
        reply = self.command({"cmd": "restart", "child": target})
        self.events.append(Event(round(self.now(), 1), "restart", target,
                                 "ok" if reply.get("ok") else str(reply.get("error"))))
        if not reply.get("ok"):
            self.problems.append(f"restart {target} refused: {reply.get('error')}")
        return True

    def reload(self) -> bool:
        self._timeout_flip = not self._timeout_flip
        timeout = self.opts.batch_timeout * (0.5 if self._timeout_flip else 1.0)
        self.write_config(timeout)
        reply = self.command({"cmd": "reload"})
        self.events.append(Event(round(self.now(), 1), "reload", f"batch_timeout={timeout}",
                                 str(reply.get("applied") if reply.get("ok")
                                     else reply.get("error"))))
        if not reply.get("ok"):
            self.problems.append(f"reload refused: {reply.get('error')}")
        return True

    def kill_jvm(self) -> bool:
        status = self.status()
        if status is None or not chaos.all_running(status):
            return False
        spark = snapshot_find(status["tree"], "spark")
        jvm = jvm_of(int(spark["pid"])) if spark and spark.get("pid") else None
        if jvm is None:
            return False
        os.kill(jvm, signal.SIGKILL)
        self.events.append(Event(round(self.now(), 1), "jvm", "spark", f"pid {jvm}"))
        return True

    # -- sampling ----------------------------------------------------------------------------
    def sample(self, publisher: Publisher) -> Sample | None:
        status = self.status()
        if status is None:
            return None
        s = Sample(round(self.now(), 1))
        v = s.values
        fds_total = 0
        assert self.proc is not None
        procs: dict[str, int] = {"daemon": self.proc.pid}
        for node in snapshot_nodes(status["tree"]):
            if node["kind"] == "worker" and node.get("pid"):
                procs[node["id"]] = int(node["pid"])
        spark_pid = procs.pop("spark", None)
        jvm = jvm_of(spark_pid) if spark_pid else None
        if spark_pid:
            procs["spark_wrapper"] = spark_pid
        if jvm:
            procs["jvm"] = jvm
        for name, pid in procs.items():
            figures = proc_figures(pid)
            if figures is None:
                continue
            v[f"rss:{name}"], v[f"fds:{name}"] = figures
            fds_total += figures[1]
        v["fds:total"] = fds_total
        stages = [k for k in v if k.startswith("rss:") and k[4:] not in
                  ("daemon", "jvm", "spark_wrapper")]
        v["rss:stages_total"] = sum(v[k] for k in stages)
        for label, path in (("metrics", self.run_dir / "metrics"), ("runtime", self.run_dir),
                            ("state", self.state_dir)):
            v[f"dir_{label}_files"], v[f"dir_{label}_bytes"] = dir_figures(path)
        t = time.perf_counter()
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30).read()
            v["scrape_ms"] = (time.perf_counter() - t) * 1000
        except OSError as exc:
            self.problems.append(f"{s.at}s: /metrics failed: {exc}")
        with open(self.log_path, "rb") as f:
            lines = sum(1 for _ in f)
        if self._log_at:
            v["log_lines_per_min"] = (lines - self._log_lines) / (s.at - self._log_at) * 60
        self._log_lines, self._log_at = lines, s.at
        v["book:published"] = publisher.published
        v["book:acked"] = int(status.get("acked", 0))
        v["book:failed"] = int(status.get("failed", 0))
        self.samples.append(s)
        return s

    # -- the timetable -----------------------------------------------------------------------
    def soak(self, publisher: Publisher) -> None:
        o = self.opts
        end = o.minutes * 60
        if o.stop_at:
            hh, mm = (int(x) for x in o.stop_at.split(":"))
            now = time.localtime()
            at = time.mktime((now.tm_year, now.tm_mon, now.tm_mday, hh, mm, 0, 0, 0, -1))
            end = min(end, self.now() + at - time.time())
        self._early = False
        signal.signal(signal.SIGUSR1, lambda *_: setattr(self, "_early", True))
        due = {"kill": o.kill_every, "restart": o.restart_every, "reload": o.reload_every,
               "jvm": o.jvm_every}
        act = {"kill": self.kill_stage, "restart": self.restart, "reload": self.reload,
               "jvm": self.kill_jvm}
        every = {"kill": o.kill_every, "restart": o.restart_every,
                 "reload": o.reload_every, "jvm": o.jvm_every}
        next_sample = 0.0
        while self.now() < end and not self._early:
            if not self.alive():
                raise SoakAbort(f"the daemon exited ({self.proc and self.proc.returncode}) "
                                f"at {self.now():.0f}s")
            now = self.now()
            if now >= next_sample:
                s = self.sample(publisher)
                next_sample = now + o.sample_every
                if s is not None and len(self.samples) % 6 == 1:
                    v = s.values
                    self.say(f"soak: {s.at:6.0f}s published {publisher.published} acked "
                             f"{v['book:acked']} tree RSS {v['rss:stages_total'] / 2**20:.0f} "
                             f"MiB daemon {v.get('rss:daemon', 0) / 2**20:.0f} MiB jvm "
                             f"{v.get('rss:jvm', 0) / 2**20:.0f} MiB fds {v['fds:total']} "
                             f"metrics files {v['dir_metrics_files']} scrape "
                             f"{v.get('scrape_ms', -1):.0f} ms")
            for what in ("jvm", "restart", "reload", "kill"):    # the rarest first
                if every[what] > 0 and now >= due[what]:
                    if act[what]():
                        due[what] += every[what]
                        e = self.events[-1]
                        self.say(f"soak: {e.at:6.0f}s {e.what} {e.target} {e.detail}")
                    break     # one fault per turn: the next waits for the tree to settle
            time.sleep(0.2)

    def settle(self) -> None:
        def drained() -> bool:
            counts = self.rabbit.counts().get(self.rabbit.queue)
            return counts == (0, 0)
        self.wait_for("the queue to drain (nothing ready or unacked)", drained,
                      timeout=self.opts.settle_timeout, interval=2.0)

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(180)
        except subprocess.TimeoutExpired:
            self.problems.append("the daemon did not exit within 180 s of SIGTERM (killed)")
            self.proc.kill()
            return self.proc.wait()

    def read_uids(self) -> list[int]:
        import pyarrow.parquet as pq

        path = self.dataset / "spark"
        if not path.exists():
            return []
        return pq.read_table(path, columns=["uid"]).column("uid").to_pylist()

    def run(self) -> dict[str, Any]:
        report: dict[str, Any] = {"options": asdict(self.opts),
                                  "load_before": os.getloadavg()}
        publisher = None
        try:
            self.setup()
            report["workdir"] = str(self.tmp)
            self.start_daemon()
            self.t0 = time.monotonic()
            publisher = Publisher(chaos.AMQP_URL, self.rabbit.queue, self.opts.rate,
                                  self.opts.payload)
            publisher.start()
            self.soak(publisher)
            report["soaked_s"] = round(self.now(), 1)
            publisher.stop()
            report["publish_errors"] = publisher.errors
            t = time.monotonic()
            self.settle()
            report["settle_s"] = round(time.monotonic() - t, 1)
            final = self.status() or {}
            report["acked"] = int(final.get("acked", 0))
            report["failed"] = int(final.get("failed", 0))
            report["restarts"] = {n["id"]: n.get("restarts", 0)
                                  for n in snapshot_nodes(final["tree"])} if final else {}
            self.sample(publisher)
            report["exit_code"] = self.stop()
            if report["exit_code"] != 0:
                self.problems.append(f"the daemon exited {report['exit_code']} on SIGTERM")
        except SoakAbort as exc:
            self.problems.append(str(exc))
        finally:
            if publisher is not None and publisher.is_alive():
                publisher.stop()
            if self.alive():
                assert self.proc is not None
                self.proc.kill()
                self.proc.wait()
        report["load_after"] = os.getloadavg()
        report["events"] = [asdict(e) for e in self.events]
        report["event_counts"] = dict(Counter(e.what for e in self.events))
        report["samples"] = [asdict(s) for s in self.samples]
        report["slopes"] = slopes(self.samples, skip=min(120.0, self.opts.minutes * 60 / 5))
        published = publisher.published if publisher else 0
        self.books(report, published)
        report["problems"] = self.problems
        return report

    def books(self, report: dict, published: int) -> None:
        uids = self.read_uids() if hasattr(self, "dataset") else []
        counts = Counter(uids)
        expected = set(range(published))
        lost = expected - counts.keys()
        strangers = counts.keys() - expected
        dlq = 0
        if hasattr(self, "rabbit"):
            dlq = self.rabbit.counts().get(self.rabbit.dlq, (0, 0))[0]
        report["books"] = {
            "published": published, "written_rows": len(uids), "distinct": len(counts),
            "acked": report.get("acked"), "lost": len(lost),
            "duplicated": len(uids) - len(counts), "strangers": len(strangers),
            "dead_lettered": dlq, "most_copies": max(counts.values(), default=0)}
        if lost:
            self.problems.append(f"{len(lost)} published messages not in the dataset, e.g. "
                                 f"{sorted(lost)[:5]}")
        if strangers:
            self.problems.append(f"{len(strangers)} uids in the dataset never published")
        if dlq:
            self.problems.append(f"{dlq} messages dead-lettered")

    def cleanup(self) -> None:
        if hasattr(self, "rabbit"):
            try:
                self.rabbit.delete()
            except Exception as exc:
                self.say(f"soak: could not delete the queue: {exc}")
        if not self.opts.keep and not self.opts.workdir and hasattr(self, "tmp"):
            shutil.rmtree(self.tmp, ignore_errors=True)


def run_soak(opts: SoakOptions, say: Callable[[str], None] = print) -> dict[str, Any]:
    s = Soak(opts, say)
    try:
        return s.run()
    finally:
        s.cleanup()


def summary(report: dict) -> Iterator[str]:
    o = report["options"]
    yield (f"soak: {report.get('soaked_s', 0) / 60:.1f} min (of {o['minutes']:g}) at "
           f"{o['rate']} msg/s; events "
           f"{report.get('event_counts')}; load {report['load_before'][0]:.1f} → "
           f"{report['load_after'][0]:.1f}")
    yield f"{'series':32} {'unit':>9} {'first':>9} {'last':>9} {'mean':>9} {'max':>9} " \
          f"{'slope/h':>9} {'±2se':>8} {'limit':>6}  flat"
    for name, s in report["slopes"].items():
        yield (f"{name:32} {s['unit']:>9} {s['first']:9.1f} {s['last']:9.1f} "
               f"{s['mean']:9.1f} {s['max']:9.1f} {s['slope_per_hour']:9.2f} "
               f"{2 * s['stderr']:8.2f} {s['threshold']:6g}  {'yes' if s['flat'] else 'NO'}")
    b = report["books"]
    yield (f"books: published {b['published']}, written {b['written_rows']} rows for "
           f"{b['distinct']} ids, acked {b['acked']}, lost {b['lost']}, duplicated "
           f"{b['duplicated']} (at most {b['most_copies']} copies), dead-lettered "
           f"{b['dead_lettered']}")
    for p in report["problems"]:
        yield f"PROBLEM: {p}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = SoakOptions()
    for name, value in asdict(defaults).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            ap.add_argument(flag, action="store_true")
        else:
            kind = type(value) if value is not None else str
            ap.add_argument(flag, type=int if name == "seed" else kind, default=value)
    ap.add_argument("--json", help="write the whole report (samples included) here")
    args = vars(ap.parse_args(argv))
    out = args.pop("json")
    opts = SoakOptions(**args)
    report = run_soak(opts)
    for line in summary(report):
        print(line)
    if out:
        Path(out).write_text(json.dumps(report, indent=1))
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
