"""Hostile neighbours: does a flood of ``status`` calls and fast scrapes slow the pipeline?

    .venv/bin/python bench/neighbours.py [--messages 2000000] [--repeat 5]
        [--status-rate 1000] [--scrape-every 0.1]

Each round runs bench/throughput.py's pipeline (generator → 2 processors → batcher →
batch processor, handlers that do nothing, metrics listener on) twice: once quiet, once
with neighbours: ``--status-rate`` ``status`` requests per second on the control socket
(two client processes, each paced to half) and a ``/metrics`` scrape every
``--scrape-every`` seconds (a third process), from the moment the daemon starts until it
exits (the clients are started a second before it, so their own start-up is not counted;
the rate is the daemon's from its first ack to its last, as throughput.py measures it).
The order alternates every round, so the machine's load (shared with other work)
hits both alike.  It prints each run's rate, what the neighbours achieved (requests per
second answered, failures, the slowest answer), and the medians and their ratio; and
where the CPU went, in µs per message: the stages' and the daemon's (from the status
tree, first ack to last, as throughput.py counts them) and the neighbour clients' own
(after their start-up), so that a change in the ratio can be told from the noise.

The neighbours are separate processes on the same two cores: their own CPU is part of
what they cost the pipeline, as it would be on a real machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import free_port
from throughput import daemon_run

REPO = Path(__file__).resolve().parent.parent

#: one neighbour process: ``status`` (paced to RATE per second) or ``scrape`` (one per
#: PERIOD); runs until its stdin closes, then prints its figures as one JSON line
CLIENT = r'''
import json, select, sys, time, urllib.request
from offbroadway.daemon.cli import control

kind, pace = sys.argv[1], float(sys.argv[2])
target = sys.stdin.readline().strip()      # started before the daemon: told where it is
cpu0 = time.process_time()                 # its own start-up is not what it costs
ok = failed = 0
slowest = 0.0
t0 = time.monotonic()
n = 0
while not select.select([sys.stdin], [], [], 0)[0]:
    due = t0 + n * pace
    now = time.monotonic()
    if due > now:
        time.sleep(due - now)
    n += 1
    t = time.perf_counter()
    try:
        if kind == "status":
            control.request(target, {"cmd": "status"}, timeout=5)
        else:
            urllib.request.urlopen(target, timeout=5).read()
        ok += 1
        slowest = max(slowest, time.perf_counter() - t)
    except Exception:
        failed += 1
        time.sleep(0.01)      # the daemon not up yet, or gone: do not spin
elapsed = time.monotonic() - t0
print(json.dumps({"kind": kind, "ok": ok, "failed": failed, "per_s": ok / elapsed,
                  "slowest_ms": slowest * 1000, "cores": (time.process_time() - cpu0) / elapsed}))
'''


def neighbours(status_rate: float, scrape_every: float, port: int
               ) -> Callable[[Path], Callable[[], dict]]:
    """What throughput.daemon_run starts beside the daemon.  The client processes are
    started here, before the daemon, so their interpreters' start-up is not charged to the
    run; once the daemon is started they are told where it is."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    plan = (("status", 2 / status_rate), ("status", 2 / status_rate),
            ("scrape", scrape_every))
    procs = [subprocess.Popen([sys.executable, "-c", CLIENT, kind, str(pace)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                              text=True) for kind, pace in plan]
    time.sleep(1.0)          # their imports done before the daemon starts

    def start(tmp: Path) -> Callable[[], dict]:
        sock = str(tmp / "run" / "control.sock")
        for (kind, _), p in zip(plan, procs):
            assert p.stdin is not None
            p.stdin.write((sock if kind == "status" else
                           f"http://127.0.0.1:{port}/metrics") + "\n")
            p.stdin.flush()

        def end() -> dict:
            out: dict = {"status_per_s": 0.0, "status_failed": 0, "status_slowest_ms": 0.0,
                         "clients_cores": 0.0}
            for p in procs:
                stdout, _ = p.communicate("x", timeout=60)
                fig = json.loads(stdout.strip().splitlines()[-1])
                out["clients_cores"] += fig["cores"]
                if fig["kind"] == "status":
                    out["status_per_s"] += fig["per_s"]
                    out["status_failed"] += fig["failed"]
                    out["status_slowest_ms"] = max(out["status_slowest_ms"], fig["slowest_ms"])
                else:
                    out.update(scrapes_per_s=fig["per_s"], scrapes_failed=fig["failed"],
                               scrape_slowest_ms=fig["slowest_ms"])
            return out
        return end
    return start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--status-rate", type=float, default=1000.0)
    ap.add_argument("--scrape-every", type=float, default=0.1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rates: dict[str, list[float]] = {"quiet": [], "hostile": []}
    #: per run, CPU µs per message: the stages', the daemon's, the neighbour clients'
    cost: dict[str, list[dict[str, float]]] = {"quiet": [], "hostile": []}
    runs = []
    print(f"load before: {os.getloadavg()}")
    for r in range(args.repeat):
        order = ["quiet", "hostile"] if r % 2 == 0 else ["hostile", "quiet"]
        for label in order:
            port = free_port()
            beside = (neighbours(args.status_rate, args.scrape_every, port)
                      if label == "hostile" else None)
            res = daemon_run(args.messages, 16, "spread", listen=f"127.0.0.1:{port}",
                             beside=beside)
            rates[label].append(res["rate"])
            cpu = {"stages": res["cpu_us_per_message_total"],
                   "daemon": res["daemon_us_per_message"]}
            extra = ""
            if res.get("beside"):
                b = res["beside"]
                # the clients' CPU since they were told where the daemon is, as µs per
                # message at this run's rate
                cpu["clients"] = b["clients_cores"] * 1e6 / res["rate"]
                extra = (f"  status {b['status_per_s']:.0f}/s (failed {b['status_failed']}, "
                         f"slowest {b['status_slowest_ms']:.0f} ms), scrapes "
                         f"{b.get('scrapes_per_s', 0):.1f}/s (slowest "
                         f"{b.get('scrape_slowest_ms', 0):.0f} ms), clients "
                         f"{b['clients_cores']:.3f} cores")
            cost[label].append(cpu)
            runs.append({"round": r, "label": label, "rate": res["rate"], "cpu_us": cpu,
                         "cpu_us_per_role": res["cpu_us_per_message"],
                         "beside": res.get("beside"), "load": os.getloadavg()})
            print(f"round {r} {label:8} {res['rate']:>10,.0f} msg/s  load "
                  f"{os.getloadavg()[0]:.1f}  CPU µs/msg: "
                  f"{', '.join(f'{k} {v:.2f}' for k, v in cpu.items())}{extra}", flush=True)
    q, h = statistics.median(rates["quiet"]), statistics.median(rates["hostile"])
    ratios = [hh / qq for qq, hh in zip(rates["quiet"], rates["hostile"])]
    print(f"median quiet {q:,.0f} msg/s, hostile {h:,.0f} msg/s: ratio {h / q:.3f}; "
          f"per-round ratios {', '.join(f'{x:.3f}' for x in ratios)}; load after "
          f"{os.getloadavg()}")
    for part in ("stages", "daemon", "clients"):
        mq = statistics.median(c.get(part, 0.0) for c in cost["quiet"])
        mh = statistics.median(c.get(part, 0.0) for c in cost["hostile"])
        print(f"CPU µs per message, {part}: quiet {mq:.2f}, with neighbours {mh:.2f} "
              f"({mh - mq:+.2f})")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "median_quiet": q, "median_hostile": h,
                                         "ratio": h / q, "round_ratios": ratios}, indent=1))


if __name__ == "__main__":
    t = time.monotonic()
    main()
    print(f"elapsed {time.monotonic() - t:.0f}s")
