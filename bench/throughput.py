"""End-to-end throughput: the real daemon against the bare ZeroMQ ceiling, in one run.

    .venv/bin/python bench/throughput.py [--messages 2000000] [--dispatcher spread demand]
        [--producers 1 10] [--max-demand 10] [--repeat 1] [--no-ceiling]

Pipeline: generator source (1 producer, or each of ``--producers``; ``count`` split among
them), processors concurrency 2 (``max_demand`` 10, or ``--max-demand`` per dispatcher),
one batcher with batch_size 100 and one batch processor, handlers that do nothing (issue
3's set-up).  ``events_per_frame`` is what the processors received per EVENTS frame.  The
daemon's rate is taken from its own status counters between the first acked message and
the last one, so process start-up is not counted.  The ceiling is the same five processes
(generator → 2 workers → collector → sink) passing msgpack frames of 100 events over
ZeroMQ PUSH/PULL with no protocol, no demand and no acks: what Python and ZeroMQ cost by
themselves on this machine.  Peak PSS of each process tree is sampled with psutil.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import psutil
import zmq

REPO = Path(__file__).resolve().parent.parent
FRAME = 100


# -- the bare ceiling ---------------------------------------------------------------------------

def _bare_worker(src: str, dst: str) -> None:
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.connect(src)
    push = ctx.socket(zmq.PUSH)
    push.connect(dst)
    while True:
        frame = pull.recv()
        if not frame:
            push.send(b"")
            break
        events = msgpack.unpackb(frame)
        push.send(msgpack.packb(events))
    push.close(linger=-1)


def _bare_sink(addr: str, expect_ends: int, result: mp.Queue) -> None:
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind(addr)
    n = ends = 0
    start = None
    while ends < expect_ends:
        frame = pull.recv()
        if start is None:
            start = time.perf_counter()
        if not frame:
            ends += 1
            continue
        n += len(msgpack.unpackb(frame))
    result.put((time.perf_counter() - (start or time.perf_counter()), n))


def bare_ceiling(messages: int, payload_bytes: int) -> dict:
    tmp = tempfile.mkdtemp(prefix="obb-", dir="/tmp")
    a, b, c = (f"ipc://{tmp}/{x}" for x in "abc")
    frames = messages // FRAME
    result: mp.Queue = mp.Queue()
    # gen → (a) → 2 workers → (b) → collector → (c) → sink
    sink = mp.Process(target=_bare_sink, args=(c, 1, result))
    collector = mp.Process(target=_collector, args=(b, c, frames))
    workers = [mp.Process(target=_bare_worker, args=(a, b)) for _ in range(2)]
    source = mp.Process(target=_bare_source_fanout, args=(a, frames, "x" * payload_bytes, 2))
    procs = [sink, collector, *workers, source]
    for p in procs:
        p.start()
    peak = _sample_pss_while([p.pid for p in procs], lambda: source.is_alive() or
                             sink.is_alive())
    elapsed, n = result.get(timeout=600)
    for p in procs:
        p.join(5)
        if p.is_alive():      # a worker whose end marker went to its sibling
            p.terminate()
            p.join()
    shutil.rmtree(tmp, ignore_errors=True)
    return {"events": n, "seconds": elapsed, "rate": n / elapsed, "peak_pss_bytes": peak}


def _bare_source_fanout(addr: str, frames: int, payload: str, consumers: int) -> None:
    ctx = zmq.Context()
    out = ctx.socket(zmq.PUSH)
    out.bind(addr)
    seq = 0
    for _ in range(frames):
        events = [[0, seq + i, f"0-{seq + i}", {"seq": seq + i, "payload": payload}, {}]
                  for i in range(FRAME)]
        seq += FRAME
        out.send(msgpack.packb(events))
    for _ in range(consumers):
        out.send(b"")
    out.close(linger=-1)


def _collector(src: str, dst: str, frames: int) -> None:
    """Ends after ``frames`` frames, not after one end marker per worker: PUSH
    round-robins the markers too, and both can reach the same worker (which then hung
    the run waiting for the other's)."""
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind(src)
    push = ctx.socket(zmq.PUSH)
    push.connect(dst)
    got = 0
    while got < frames:
        frame = pull.recv()
        if not frame:
            continue
        got += 1
        push.send(msgpack.packb(msgpack.unpackb(frame)))
    push.send(b"")
    push.close(linger=-1)


def _tree_pss(pids: list[int]) -> int:
    total = 0
    seen: set[int] = set()
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for p in procs:
            if p.pid in seen:
                continue
            seen.add(p.pid)
            try:
                total += p.memory_full_info().pss
            except psutil.Error:
                pass
    return total


def _sample_pss_while(pids: list[int], alive, interval: float = 0.25) -> int:
    peak = 0
    while alive():
        peak = max(peak, _tree_pss(pids))
        time.sleep(interval)
    return peak


# -- the daemon ---------------------------------------------------------------------------------

HANDLER = '''
from offbroadway import Pipeline

class Noop(Pipeline):
    def handle_message(self, processor, message, context):
        return message.put_batcher("sink")

    def handle_batch(self, batcher, messages, batch_info, context):
        return messages
'''


def daemon_run(messages: int, payload_bytes: int, dispatcher: str, producers: int = 1,
               max_demand: int = 10) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="obd-", dir="/tmp"))
    (tmp / "bench_noop.py").write_text(HANDLER)
    config = tmp / "bench.toml"
    config.write_text(f"""
[pipeline]
name = "bench"
handler = "bench_noop:Noop"

[producer]
source = "generator"
concurrency = {producers}
dispatcher = "{dispatcher}"

[producer.options]
count = {messages // producers}
payload_bytes = {payload_bytes}

[processors.default]
concurrency = 2
max_demand = {max_demand}

[batchers.sink]
batch_size = 100
batch_timeout = 1.0
concurrency = 1

[metrics]
listen = ""

[runtime]
dir = "{tmp}/run"
state_dir = "{tmp}/state"
""")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp), str(REPO)]))
    daemon = subprocess.Popen([sys.executable, "-m", "offbroadway.daemon.cli", "run",
                               str(config), "--until-idle"], cwd=tmp, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    sock = str(tmp / "run" / "control.sock")
    from offbroadway.daemon import control

    first: tuple[float, int] | None = None
    last: tuple[float, int] = (time.perf_counter(), 0)
    peak = 0
    frames: dict[str, tuple[int, int]] = {}
    cpu: dict[int, tuple[str, float]] = {}
    while daemon.poll() is None:
        try:
            status = control.request(sock, {"cmd": "status"}, timeout=5)["status"]
        except (control.ControlError, OSError, ValueError):   # not up yet, or stopping
            time.sleep(0.1)
            continue
        acked = _producer_acked(status["tree"])
        _processor_frames(status["tree"], frames)
        _stage_cpu(status["tree"], cpu)
        now = time.perf_counter()
        if acked and first is None:
            first = (now, acked)
        if acked > last[1]:
            last = (now, acked)
        peak = max(peak, _tree_pss([daemon.pid]))
        time.sleep(0.2)
    err = daemon.stderr.read()
    shutil.rmtree(tmp, ignore_errors=True)
    if daemon.returncode != 0 or first is None:
        raise SystemExit(f"daemon failed ({daemon.returncode}):\n{err[-3000:]}")
    n = last[1] - first[1]
    events_in = sum(e for e, _ in frames.values())
    frames_in = sum(f for _, f in frames.values())
    by_role: dict[str, float] = {}
    for role, seconds in cpu.values():
        by_role[role] = by_role.get(role, 0.0) + seconds
    return {"events": last[1], "seconds": last[0] - first[0],
            "rate": n / (last[0] - first[0]), "peak_pss_bytes": peak,
            "events_per_frame": events_in / frames_in if frames_in else None,
            "cpu_us_per_event": {r: round(s / last[1] * 1e6, 2) for r, s in by_role.items()}}


def _stage_cpu(tree: dict, seen: dict[int, tuple[str, float]]) -> None:
    """Every stage process's CPU seconds (user + system) so far, by pid: CPU per event is
    what the dispatchers cost, and unlike a rate it barely moves with the machine's load.
    Sampled every poll, so the last ~0.2 s of a stage's life is missed (the same for both
    dispatchers)."""
    pid = tree.get("pid")
    if pid and tree.get("kind") == "worker":
        role = next(r for r in ("batch_processor", "batcher", "processor", "producer", "")
                    if tree["id"].startswith(r))
        try:
            t = psutil.Process(pid).cpu_times()
            seen[pid] = (role or tree["id"], t.user + t.system)
        except psutil.Error:
            pass
    for child in tree.get("children", []):
        _stage_cpu(child, seen)


def _processor_frames(tree: dict, seen: dict[str, tuple[int, int]]) -> None:
    """Processors' (events, event frames) received, as last reported (stats lag 1 s)."""
    if tree["id"].startswith("processor_") and "event_frames" in tree.get("messages", {}):
        m = tree["messages"]
        seen[tree["id"]] = (m.get("in", 0), m["event_frames"])
    for child in tree.get("children", []):
        _processor_frames(child, seen)


def _producer_acked(tree: dict) -> int:
    total = 0
    if tree["id"].startswith("producer_"):
        total += tree.get("messages", {}).get("acked", 0)
    for child in tree.get("children", []):
        total += _producer_acked(child)
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--payload-bytes", type=int, default=100)
    ap.add_argument("--dispatcher", nargs="+", default=["spread"])
    ap.add_argument("--producers", nargs="+", type=int, default=[1])
    ap.add_argument("--max-demand", nargs="+", type=int, default=[10],
                    help="processors' max_demand, per dispatcher in --dispatcher order")
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per dispatcher, the order reversed every other round; the "
                         "rate reported is the median (the machine is shared: noisy)")
    ap.add_argument("--no-ceiling", action="store_true", help="skip the bare ZeroMQ ceiling")
    args = ap.parse_args()
    results: dict = {
        "machine": f"{os.cpu_count()} cores, {psutil.virtual_memory().total >> 30} GiB"}
    if not args.no_ceiling:
        results["ceiling"] = bare_ceiling(args.messages, args.payload_bytes)
    for producers in args.producers:
        # the key is the dispatcher alone for 1 producer (the historical output)
        suffix = "" if producers == 1 else f"@{producers}p"
        demands = dict(zip(args.dispatcher, args.max_demand * len(args.dispatcher)))
        runs: dict[str, list[dict]] = {d: [] for d in args.dispatcher}
        for rep in range(args.repeat):
            order = args.dispatcher if rep % 2 == 0 else args.dispatcher[::-1]
            for d in order:
                runs[d].append(daemon_run(args.messages, args.payload_bytes, d, producers,
                                          demands[d]))
        for d in args.dispatcher:
            r = dict(runs[d][-1])
            r["rate"] = statistics.median(x["rate"] for x in runs[d])
            if args.repeat > 1:
                r["rates"] = [round(x["rate"]) for x in runs[d]]
            r["max_demand"] = demands[d]
            if "ceiling" in results:
                r["ratio_to_ceiling"] = r["rate"] / results["ceiling"]["rate"]
            results[d + suffix] = r
        if len(args.dispatcher) > 1:
            a, b = args.dispatcher[:2]
            results[f"{a}/{b}{suffix}"] = (results[a + suffix]["rate"] /
                                           results[b + suffix]["rate"])
            if args.repeat > 1:
                results[f"{a}/{b}{suffix} per round"] = [
                    round(x["rate"] / y["rate"], 3) for x, y in zip(runs[a], runs[b])]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
