"""Light load: K jobs arriving at once on C idle processors, under both dispatchers.

    .venv/bin/python bench/light_load.py [--sources generator spool rabbitmq]
        [--producers 10 1] [--dispatcher spread demand] [--jobs 10] [--processors 10]
        [--job-seconds 0.5] [--repeat 1]

Issue 6's scenario (seeds 003/004): ``--jobs`` jobs whose handler sleeps ``--job-seconds``
and records its start time and pid, on ``--processors`` processors with the default demand
settings (max_demand 1000, min_demand 500 since issue 12), no batchers.  For each source,
producer count and dispatcher a fresh daemon is started and the jobs *arrive* only once
every producer reports demand from every processor (all subscribed, demand placed), so
start-up order is not what is measured:

* ``generator``: ``count`` is per producer, so jobs / producers each.  Its messages exist
  from the start, so the bench pauses the producers (the operator's ``drain``) as soon as
  they are up, before the processors (started after them) can subscribe, and resumes
  them (``resume``) once every processor has placed its demand: arrival is the resume.
  A run where a job started before the resume (the pause lost the race) measured
  nothing: it is made again (at most three times), and said so.
* ``spool``: one file per job renamed into the spool directory at arrival (names chosen
  so ``crc32(name) % producers`` gives every producer the same number of files, as the
  scenario wants the jobs spread over the producers), ``scan_interval`` 10 ms.
* ``rabbitmq``: a fresh queue, ``prefetch_count = "auto"``; arrival is just before the
  jobs are published (RabbitMQ round-robins them over the producers' channels).

Reported per run: makespan (last job end minus arrival) and its ratio to the ideal
(``ceil(jobs / processors)`` job durations), distinct processors, the per-job wait (start
minus arrival) p50/p99, and the processors' ASK / RETRACT frames during the burst.
``--jobs 30`` is the backlog variant: more jobs than processors.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

import psutil
from offbroadway.daemon.config.names import role_of
from offbroadway.supervision.tree import snapshot_nodes

REPO = Path(__file__).resolve().parent.parent

HANDLER = '''
import json, os, time
from offbroadway import Pipeline


class Sleeper(Pipeline):
    def handle_message(self, processor, message, context):
        start = time.time()
        time.sleep(context["job_seconds"])
        rec = {"id": str(message.id), "pid": os.getpid(), "start": start, "end": time.time()}
        with open(os.path.join(context["out"], f"jobs-{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(rec) + "\\n")
        return message
'''


def spool_names(jobs: int, producers: int) -> list[str]:
    """``jobs`` file names spread evenly over the producers by the spool's crc32 split."""
    per = {p: [] for p in range(producers)}
    want = -(-jobs // producers)
    i = 0
    while sum(len(v) for v in per.values()) < jobs:
        name = f"job-{i:05d}.jsonl"
        p = zlib.crc32(name.encode()) % producers
        if len(per[p]) < want and (sum(len(v) for v in per.values()) < jobs):
            per[p].append(name)
        i += 1
    return [n for p in range(producers) for n in per[p]]


def config_text(tmp: Path, source: str, options: dict, producers: int, processors: int,
                dispatcher: str, job_seconds: float) -> str:
    opts = "\n".join(f"{k} = {json.dumps(v)}" for k, v in options.items())
    return f"""
[pipeline]
name = "light"
handler = "bench_light:Sleeper"
shutdown_timeout = 10
context = {{ out = "{tmp / 'out'}", job_seconds = {job_seconds} }}

[producer]
source = "{source}"
concurrency = {producers}
dispatcher = "{dispatcher}"

[producer.options]
{opts}

[processors.default]
concurrency = {processors}

[metrics]
listen = ""

[runtime]
dir = "{tmp}/run"
state_dir = "{tmp}/state"
"""


def _status(sock: str) -> dict | None:
    from offbroadway.daemon.cli import control

    try:
        return control.request(sock, {"cmd": "status"}, timeout=5)["status"]
    except (control.ControlError, OSError, ValueError):
        return None


def _ready(sock: str, producers: int, processors: int) -> bool:
    """Every producer reports demand from every processor (stats come once a second)."""
    status = _status(sock)
    if status is None:
        return False
    demands = [n.get("messages", {}).get("demand", 0) for n in snapshot_nodes(status["tree"])
               if role_of(n["id"]) == "producer"]
    procs = [n for n in snapshot_nodes(status["tree"]) if role_of(n["id"]) == "processor"]
    return (len(demands) == producers and all(d >= processors for d in demands)
            and len(procs) == processors and all(p.get("messages") for p in procs))


def _control(sock: str, cmd: str) -> None:
    from offbroadway.daemon.cli import control

    if not control.request(sock, {"cmd": cmd}, timeout=5).get("ok"):
        raise RuntimeError(f"control command {cmd} refused")


class LostRace(RuntimeError):
    """The generator's producers were paused too late: a processor subscribed first and a
    job ran before the arrival.  Nothing was measured; the run is made again."""


#: how many times a run whose pause lost the race is made again before the bench gives up
RACE_RETRIES = 3


def _pause_producers(sock: str, producers: int, deadline: float) -> None:
    """Pause the producers the moment they are all running: the processors start only
    after them, so no processor has asked yet."""
    while time.monotonic() < deadline:
        status = _status(sock)
        if status is not None:
            running = [n for n in snapshot_nodes(status["tree"])
                       if role_of(n["id"]) == "producer" and n["state"] == "running"]
            if len(running) == producers:
                _control(sock, "drain")
                return
        time.sleep(0.005)
    raise RuntimeError("producers never came up")


def _processor_counters(sock: str) -> dict[str, int]:
    status = _status(sock) or {"tree": {"id": "", "children": []}}
    total: dict[str, int] = {}
    for n in snapshot_nodes(status["tree"]):
        if role_of(n["id"]) == "processor":
            for k in ("asks", "retracts"):
                total[k] = total.get(k, 0) + n.get("messages", {}).get(k, 0)
    return total


def run_once(source: str, producers: int, processors: int, jobs: int, job_seconds: float,
             dispatcher: str, timeout: float = 120.0) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="obl-", dir="/tmp"))
    os.chmod(tmp, 0o700)
    (tmp / "out").mkdir()
    (tmp / "bench_light.py").write_text(HANDLER)
    rabbit = None
    queue = None
    stage_dir = tmp / "staging"
    if source == "generator":
        if jobs % producers:
            raise SystemExit("generator: --jobs must be a multiple of the producer count")
        src, options = "generator", {"count": jobs // producers}
    elif source == "spool":
        spool = tmp / "spool"
        spool.mkdir()
        stage_dir.mkdir()
        names = spool_names(jobs, producers)
        for i, name in enumerate(names):
            (stage_dir / name).write_text(json.dumps({"seq": i}) + "\n")
        src, options = "spool", {"path": str(spool), "scan_interval": 0.01}
    elif source == "rabbitmq":
        import pika

        url = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
        rabbit = pika.BlockingConnection(pika.URLParameters(url))
        channel = rabbit.channel()
        queue = f"oblight-{uuid.uuid4().hex[:10]}"
        channel.queue_declare(queue)
        src, options = "rabbitmq", {"url": url, "queue": queue, "prefetch_count": "auto"}
    else:
        raise SystemExit(f"unknown source {source!r}")
    config = tmp / "light.toml"
    config.write_text(config_text(tmp, src, options, producers, processors, dispatcher,
                                  job_seconds))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp), str(REPO)]))
    daemon = subprocess.Popen([sys.executable, "-m", "offbroadway.daemon.cli", "run",
                               str(config)], cwd=tmp, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    sock = str(tmp / "run" / "control.sock")
    try:
        deadline = time.monotonic() + timeout
        if source == "generator":
            _pause_producers(sock, producers, deadline)
        while not _ready(sock, producers, processors):
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"pipeline not ready:\n{daemon.stderr.read()[-3000:]}")
            time.sleep(0.1)
        before = _processor_counters(sock)
        arrival = time.time()
        if source == "generator":
            _control(sock, "resume")
        elif source == "spool":
            for name in names:
                os.rename(stage_dir / name, spool / name)
        else:
            for i in range(jobs):
                channel.basic_publish("", queue, json.dumps({"seq": i}).encode())
        records: list[dict] = []
        while len(records) < jobs:
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"only {len(records)} of {jobs} jobs ran:\n"
                                   f"{daemon.stderr.read()[-3000:]}")
            time.sleep(0.05)
            records = _read(tmp / "out")
        time.sleep(1.1)   # stats come once a second
        after = _processor_counters(sock)
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(60)
            except subprocess.TimeoutExpired:
                daemon.kill()
        if rabbit is not None:
            try:
                rabbit.channel().queue_delete(queue)
                rabbit.close()
            except Exception:
                pass
        shutil.rmtree(tmp, ignore_errors=True)
    waits = sorted(r["start"] - arrival for r in records)
    if waits[0] < 0:
        raise LostRace("a job started before it arrived (the pause lost the race)")
    return {
        "makespan": max(r["end"] for r in records) - arrival,
        "distinct_processors": len({r["pid"] for r in records}),
        "wait_p50": statistics.median(waits),
        "wait_p99": _quantile(waits, 0.99),
        "wait_max": waits[-1],
        # processors' ask/retract frames during the burst (stats lag by up to a second)
        "asks": after.get("asks", 0) - before.get("asks", 0),
        "retracts": after.get("retracts", 0) - before.get("retracts", 0),
    }


def _read(out: Path) -> list[dict]:
    records = []
    for p in out.glob("jobs-*.jsonl"):
        records.extend(json.loads(line) for line in p.read_text().splitlines() if line)
    return records


def _quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile (with 10 jobs p99 is the slowest one)."""
    k = max(0, min(len(sorted_values) - 1, int(-(-q * len(sorted_values) // 1)) - 1))
    return sorted_values[k]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sources", nargs="+", default=["generator", "spool", "rabbitmq"])
    ap.add_argument("--producers", nargs="+", type=int, default=[10, 1])
    ap.add_argument("--dispatcher", nargs="+", default=["spread", "demand"])
    ap.add_argument("--jobs", type=int, default=10)
    ap.add_argument("--processors", type=int, default=10)
    ap.add_argument("--job-seconds", type=float, default=0.5)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    results: dict[str, Any] = {
        "machine": f"{os.cpu_count()} cores, {psutil.virtual_memory().total >> 30} GiB, "
                   f"load {os.getloadavg()[0]:.1f}",
        "jobs": args.jobs, "processors": args.processors, "job_seconds": args.job_seconds,
        "runs": []}
    for source in args.sources:
        for producers in args.producers:
            for rep in range(args.repeat):
                for dispatcher in args.dispatcher:
                    for attempt in range(RACE_RETRIES + 1):
                        try:
                            r = run_once(source, producers, args.processors, args.jobs,
                                         args.job_seconds, dispatcher)
                            break
                        except LostRace as exc:
                            if attempt == RACE_RETRIES:
                                raise
                            print(f"{source} producers={producers}: {exc}; run again",
                                  file=sys.stderr)
                    ideal = -(-args.jobs // args.processors) * args.job_seconds
                    r.update(source=source, producers=producers, dispatcher=dispatcher,
                             repeat=rep, makespan_ideal=ideal,
                             makespan_ratio=r["makespan"] / ideal)
                    results["runs"].append(r)
                    print(f"{source:9} producers={producers:<3} {dispatcher:6} "
                          f"makespan={r['makespan']:.3f}s ({r['makespan_ratio']:.2f}x) "
                          f"distinct={r['distinct_processors']} "
                          f"wait p50={r['wait_p50'] * 1000:.0f}ms "
                          f"p99={r['wait_p99'] * 1000:.0f}ms "
                          f"asks={r['asks']} retracts={r['retracts']}", file=sys.stderr)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
