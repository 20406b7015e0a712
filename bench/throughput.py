"""End-to-end throughput: the real daemon against two yardsticks, interleaved.

    .venv/bin/python bench/throughput.py [--messages 2000000] [--repeat 5]
        [--payload-bytes 16] [--dispatcher spread demand] [--producers 1]
        [--max-demand N ...] [--no-ceiling] [--ceiling PATH] [--no-lean] [--lean PATH]

Pipeline (issue 12's shape): generator source (1 producer, or ``--producers``; ``count``
split among them) → processors concurrency 2 → one batcher (``batch_size`` 100) → one
batch processor, handlers that do nothing but route to the batcher.  Demand settings are
the defaults unless ``--max-demand`` names them (one per dispatcher, min_demand half).

The yardsticks are two scripts that sit beside the repository, in ``../shared/bench/``
(a checkout of the project's shared folder; the bench runs without them, and says so):

* ``ceiling.py``: the transport's limit, the same five processes passing msgpack frames
  of 100 events over ZeroMQ with no protocol, demand or acks;
* ``lean_pipeline.py``: a lean pipeline of the same shape that keeps Broadway's
  per-message work (a ``Message`` per event, the real callbacks, an in-flight table,
  demand, per-message acks) and leaves out failures, metadata, blame, metrics,
  partitioning and supervision.

Both are run as they are, in the same run: every round runs the ceiling, the lean
pipeline and each configuration (the order reversed every other round), so the machine's
load, shared with other work, hits them alike.  The ratios that count are a round's rate
over the same round's yardsticks; the summary quotes medians.  The lean pipeline's CPU
per role is read the same way as the daemon's (its five processes are its children, in
the order it starts them: producer, batch processor, batcher, two processors).

Per round it prints: messages/s; the yardsticks' rates; the ratios to each; CPU µs per message per
stage role (user + system of the whole process, all processes of the role summed, from
the first acked message to the last, so start-up is not counted), of which the kernel's
share (system time) and the ZeroMQ I/O threads (every thread but the main one, from
``/proc`` via psutil); data-plane frames sent
per message (every stage's ``frames`` counter: events, batches, asks, retracts, acks);
and the peak PSS of the whole process tree (daemon and stages).  The daemon's rate is
taken from its own status counters between the first acked message and the last one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from benchlib import (
    NOOP_HANDLER,
    producer_acked,
    sample_cpu,
    sink_and_runtime,
    start_daemon,
    statuses,
)
from offbroadway.daemon.config.names import role_of
from offbroadway.supervision.tree import snapshot_nodes

REPO = Path(__file__).resolve().parent.parent
ROLES = ("producer", "processor", "batcher", "batch_processor")
#: the tree's PSS is read every this many status polls (0.2 s each): reading every
#: process's smaps costs this bench's own CPU, on the two cores the runs share
PSS_EVERY = 5


def _yardstick(name: str) -> Path:
    """``../shared/bench/<name>`` beside the repository (a worktree sits one level
    further down, so the parent's parent is tried too)."""
    for base in (REPO.parent, REPO.parent.parent):
        path = base / "shared" / "bench" / name
        if path.exists():
            return path
    return REPO.parent / "shared" / "bench" / name


# -- memory ----------------------------------------------------------------------------------

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


# -- the shared ceiling --------------------------------------------------------------------------

def ceiling_run(path: Path, messages: int) -> dict:
    """Run the shared ceiling as it is; its rate and the peak PSS of its tree."""
    proc = subprocess.Popen([sys.executable, str(path), str(messages)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_pss([proc.pid]))
        time.sleep(0.2 * PSS_EVERY)
    out, err = proc.communicate()
    try:
        rate = float(out.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise SystemExit(f"ceiling failed ({proc.returncode}): {err[-2000:]}") from None
    return {"rate": rate, "peak_pss_bytes": peak}


#: the lean pipeline's processes, in the order it starts them (its children, by pid)
LEAN_ROLES = ("producer", "batch_processor", "batcher", "processor", "processor")


def lean_run(path: Path, messages: int) -> dict:
    """Run the shared lean pipeline as it is: its rate (it times its first to its last
    batch) and its CPU per message per role (each child's last sample; start-up
    included, as the script itself counts it)."""
    proc = subprocess.Popen([sys.executable, str(path), str(messages)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    cpu: dict[int, float] = {}
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            for child in root.children():
                try:
                    t = child.cpu_times()
                    cpu[child.pid] = t.user + t.system
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        time.sleep(0.1)
    out, err = proc.communicate()
    try:
        rate = float(out.split()[0])
    except (IndexError, ValueError):
        raise SystemExit(f"lean pipeline failed ({proc.returncode}): {err[-2000:]}") from None
    roles: dict[str, float] = dict.fromkeys(ROLES, 0.0)
    for role, pid in zip(LEAN_ROLES, sorted(cpu)):
        roles[role] += cpu[pid] / messages * 1e6
    return {"rate": rate, "cpu_us_per_message": {r: round(v, 2) for r, v in roles.items()},
            "cpu_us_per_message_total": round(sum(roles.values()), 2)}


# -- the daemon ---------------------------------------------------------------------------------


def daemon_run(messages: int, payload_bytes: int, dispatcher: str, producers: int = 1,
               max_demand: int | None = None, listen: str = "",
               beside: Callable[[Path], Callable[[], dict]] | None = None) -> dict:
    """One run of the pipeline to its end; ``listen``: the metrics listener (and live
    page), off by default (bench/page_cost.py turns it on).  ``beside`` is started with
    the run's directory once the daemon is (bench/neighbours.py starts its hostile
    clients there) and returns what ends it, whose figures go in the result."""
    tmp = Path(tempfile.mkdtemp(prefix="obd-", dir="/tmp"))
    (tmp / "bench_noop.py").write_text(NOOP_HANDLER)
    demand = "" if max_demand is None else f"max_demand = {max_demand}\n"
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
{demand}
""" + sink_and_runtime(tmp, listen))
    daemon = start_daemon(tmp, config, "--until-idle", stdout=subprocess.DEVNULL)
    sock = str(tmp / "run" / "control.sock")
    end_beside = beside(tmp) if beside is not None else None

    first: tuple[float, int, dict] | None = None
    last: tuple[float, int, dict] = (time.perf_counter(), 0, {})
    peak = 0
    frames: dict[str, tuple[int, int, int, int]] = {}
    # pid -> latest (role, cpu, io cpu): a stage that exited keeps its last sample
    cpu: dict[int, tuple[str, float, float, float]] = {}
    polls = 0
    me = psutil.Process(daemon.pid)
    for status in statuses(daemon, sock, 0.2):
        polls += 1
        acked = producer_acked(status["tree"])
        sample_cpu(status["tree"], cpu)
        try:   # the daemon's own CPU (the live page's work is done there)
            t = me.cpu_times()
            cpu[daemon.pid] = ("daemon", t.user + t.system, 0.0, t.system)
        except psutil.Error:
            pass
        _stage_frames(status["tree"], frames)
        now = time.perf_counter()
        if acked and first is None:
            first = (now, acked, dict(cpu))
        if acked > last[1]:
            last = (now, acked, dict(cpu))
        if polls % PSS_EVERY == 1:
            peak = max(peak, _tree_pss([daemon.pid]))
    err = daemon.stderr.read() if daemon.stderr else ""
    beside_figures = end_beside() if end_beside is not None else None
    shutil.rmtree(tmp, ignore_errors=True)
    if daemon.returncode != 0 or first is None or last[1] <= first[1]:
        raise SystemExit(f"daemon failed ({daemon.returncode}):\n{err[-3000:]}")
    n = last[1] - first[1]
    cpu_us: dict[str, float] = {}
    io_us: dict[str, float] = {}
    sys_us = 0.0
    for pid, (role, total, io, system) in last[2].items():
        t0, io0, sys0 = first[2].get(pid, (role, 0.0, 0.0, 0.0))[1:]
        cpu_us[role] = cpu_us.get(role, 0.0) + (total - t0) / n * 1e6
        io_us[role] = io_us.get(role, 0.0) + (io - io0) / n * 1e6
        if role != "daemon":
            sys_us += (system - sys0) / n * 1e6
    sent = sum(f[0] for f in frames.values())
    produced = sum(f[1] for sid, f in frames.items() if role_of(sid) == "producer")
    proc = [f for sid, f in frames.items() if role_of(sid) == "processor"]
    proc_frames = sum(f[3] for f in proc)
    return {"rate": n / (last[0] - first[0]), "messages": last[1],
            "peak_pss_bytes": peak,
            "frames_per_message": sent / produced if produced else None,
            "events_per_processor_frame": (sum(f[2] for f in proc) / proc_frames
                                           if proc_frames else None),
            "cpu_us_per_message": {r: round(cpu_us.get(r, 0.0), 2) for r in ROLES},
            "io_threads_us_per_message": {r: round(io_us.get(r, 0.0), 2) for r in ROLES},
            "cpu_us_per_message_total": round(sum(v for r, v in cpu_us.items()
                                                  if r != "daemon"), 2),
            "daemon_us_per_message": round(cpu_us.get("daemon", 0.0), 2),
            "kernel_us_per_message": round(sys_us, 2),
            **({"beside": beside_figures} if beside_figures is not None else {})}






def _stage_frames(tree: dict, seen: dict[str, tuple[int, int, int, int]]) -> None:
    """Each stage's data-plane frames sent, messages out and in, and (processors) EVENTS
    frames received, as last reported (stats come once a second, and at a stage's end)."""
    for node in snapshot_nodes(tree):
        m = node.get("messages", {})
        if node.get("kind") == "worker" and "frames" in m:
            seen[node["id"]] = (m["frames"], m.get("out", 0), m.get("in", 0),
                                m.get("event_frames", 0))




def _line(label: str, r: dict, ceiling: float | None, lean: float | None) -> str:
    ratio = f" of the ceiling {r['rate'] / ceiling:.3f}" if ceiling else ""
    if lean:
        ratio += f", of lean {r['rate'] / lean:.3f}"
    cpu = " / ".join(f"{r['cpu_us_per_message'][x]:.2f}" for x in ROLES)
    io = " / ".join(f"{r['io_threads_us_per_message'][x]:.2f}" for x in ROLES)
    fpm = r["frames_per_message"]
    return (f"  {label}: {r['rate']:,.0f} msg/s{ratio}; CPU us/msg producer / processors / "
            f"batcher / batch processor {cpu} (total {r['cpu_us_per_message_total']:.2f}, "
            f"of which kernel {r['kernel_us_per_message']:.2f}; "
            f"zmq I/O threads {io}); frames/msg "
            f"{'?' if fpm is None else f'{fpm:.4f}'} (events per processor frame "
            f"{r['events_per_processor_frame'] or 0:.0f}); "
            f"PSS {r['peak_pss_bytes'] / 2**20:.0f} MB")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--payload-bytes", type=int, default=16)
    ap.add_argument("--dispatcher", nargs="+", default=["spread"])
    ap.add_argument("--producers", type=int, default=1)
    ap.add_argument("--max-demand", nargs="+", type=int, default=None,
                    help="processors' max_demand per dispatcher (default: the config's)")
    ap.add_argument("--repeat", type=int, default=1, help="interleaved rounds")
    ap.add_argument("--no-ceiling", action="store_true", help="skip the shared ceiling")
    ap.add_argument("--ceiling", type=Path, default=_yardstick("ceiling.py"),
                    help="the shared ceiling script (run as it is)")
    ap.add_argument("--no-lean", action="store_true", help="skip the shared lean pipeline")
    ap.add_argument("--lean", type=Path, default=_yardstick("lean_pipeline.py"),
                    help="the shared lean pipeline script (run as it is)")
    args = ap.parse_args()
    for flag, path in (("no_ceiling", args.ceiling), ("no_lean", args.lean)):
        if not getattr(args, flag) and not path.exists():
            print(f"yardstick {path} not found (it sits beside the repository, in "
                  f"../shared/bench/): running without it", flush=True)
            setattr(args, flag, True)
    demands = dict(zip(args.dispatcher, args.max_demand or [None] * len(args.dispatcher)))
    runs: dict[str, list[dict]] = {d: [] for d in args.dispatcher}
    ceilings: list[dict] = []
    leans: list[dict] = []
    print(f"machine: {os.cpu_count()} cores; load {os.getloadavg()}", flush=True)
    for rep in range(args.repeat):
        print(f"round {rep + 1}", flush=True)
        ceiling = None
        if not args.no_ceiling:
            c = ceiling_run(args.ceiling, args.messages)
            ceilings.append(c)
            ceiling = c["rate"]
            print(f"  ceiling: {ceiling:,.0f} msg/s; PSS {c['peak_pss_bytes'] / 2**20:.0f} MB",
                  flush=True)
        # the lean pipeline and the configurations, in turn, the order reversed every
        # other round
        order = ["lean", *args.dispatcher] if not args.no_lean else list(args.dispatcher)
        results: dict[str, dict] = {}
        for d in order if rep % 2 == 0 else order[::-1]:
            if d == "lean":
                results[d] = lean_run(args.lean, args.messages)
            else:
                results[d] = daemon_run(args.messages, args.payload_bytes, d,
                                        args.producers, demands[d])
        lean = None
        if "lean" in results:
            lr = results["lean"]
            leans.append(lr)
            lean = lr["rate"]
            cpu = " / ".join(f"{lr['cpu_us_per_message'][x]:.2f}" for x in ROLES)
            print(f"  lean: {lean:,.0f} msg/s; CPU us/msg producer / processors / batcher / "
                  f"batch processor {cpu} (total {lr['cpu_us_per_message_total']:.2f}, "
                  f"start-up included)", flush=True)
        for d in args.dispatcher:
            r = results[d]
            if ceiling:
                r["ceiling"] = ceiling
                r["ratio"] = r["rate"] / ceiling
            if lean:
                r["lean"] = lean
                r["ratio_to_lean"] = r["rate"] / lean
            runs[d].append(r)
            label = d if demands[d] is None else f"{d} max_demand {demands[d]}"
            print(_line(label, r, ceiling, lean), flush=True)
    summary: dict = {"load_after": os.getloadavg()}
    if ceilings:
        summary["ceiling_median"] = statistics.median(c["rate"] for c in ceilings)
    if leans:
        summary["lean_median"] = statistics.median(r["rate"] for r in leans)
        summary["lean_cpu_us_per_message_median"] = {
            x: statistics.median(r["cpu_us_per_message"][x] for r in leans) for x in ROLES}
    for d, rs in runs.items():
        s = {"rate_median": statistics.median(r["rate"] for r in rs),
             "rates": [round(r["rate"]) for r in rs],
             "cpu_us_per_message_median": {
                 x: statistics.median(r["cpu_us_per_message"][x] for r in rs) for x in ROLES},
             "frames_per_message_median": statistics.median(
                 r["frames_per_message"] or 0 for r in rs),
             "peak_pss_mb_median": statistics.median(r["peak_pss_bytes"] for r in rs) / 2**20}
        if ceilings:
            s["ratios"] = [round(r["ratio"], 3) for r in rs]
            s["ratio_median"] = statistics.median(r["ratio"] for r in rs)
        if leans:
            s["ratios_to_lean"] = [round(r["ratio_to_lean"], 3) for r in rs]
            s["ratio_to_lean_median"] = statistics.median(r["ratio_to_lean"] for r in rs)
        summary[d] = s
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
