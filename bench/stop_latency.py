"""Stop latency: SIGTERM to the daemon in the middle of a long run, until the daemon exits.

    .venv/bin/python bench/stop_latency.py [--runs 5] [--after 1.0] [--metrics/--no-metrics]

Pipeline: the shape of ``bench/throughput.py`` (generator source with no ``count``, so it
never runs dry, 16-byte payload; processors concurrency 2 at the configured defaults; one
batcher with batch_size 100 and one batch processor; handlers that do nothing), with the
metrics endpoint on (a free localhost port), as a service runs.  Each run starts a daemon,
waits until the producer has acked its first messages, lets it run ``--after`` seconds
more and sends SIGTERM, then times the exit.  The daemon logs in JSON, so the time splits
into the drain (SIGTERM → ``drain complete``: in-flight messages finished and acked) and
the stop (``drain complete`` → exit: the tree stopped in reverse start order, the metrics
server closed).  That nothing is lost on such a stop is for the test to show
(tests/e2e/test_stop.py); the bench prints the daemon's closing line beside each figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchlib import (
    NOOP_HANDLER,
    free_port,
    producer_messages,
    sink_and_runtime,
    start_daemon,
    status,
)


def write_config(tmp: Path, metrics: bool) -> Path:
    (tmp / "bench_stop.py").write_text(NOOP_HANDLER)
    listen = f"127.0.0.1:{free_port()}" if metrics else ""
    config = tmp / "bench.toml"
    config.write_text("""
[pipeline]
name = "stopbench"
handler = "bench_stop:Noop"

[producer]
source = "generator"

[producer.options]
payload_bytes = 16

[processors.default]
concurrency = 2

""" + sink_and_runtime(tmp, listen, 'log_format = "json"\n'))
    return config




def one_run(after: float, metrics: bool) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="obs-", dir="/tmp"))
    try:
        config = write_config(tmp, metrics)
        daemon = start_daemon(tmp, config)
        sock = str(tmp / "run" / "control.sock")
        deadline = time.monotonic() + 60
        while True:
            if daemon.poll() is not None or time.monotonic() > deadline:
                daemon.kill()
                raise SystemExit(f"daemon never got going:\n{daemon.stderr.read()[-3000:]}")
            now = status(sock)
            if now and producer_messages(now["tree"]).get("acked", 0) > 0:
                break
            time.sleep(0.05)
        time.sleep(after)
        sent = time.time()
        daemon.send_signal(signal.SIGTERM)
        out, err = daemon.communicate(timeout=120)
        exited = time.time()
        marks: dict[str, float] = {}
        for line in err.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            msg = rec.get("msg", "")
            if rec.get("child") != "daemon":
                continue
            if msg.startswith("drain complete"):
                marks["drained"] = rec["ts"]
            elif msg.startswith("pipeline ") and msg.endswith(" stopped"):
                marks["stopped"] = rec["ts"]
        acked_line = next((ln for ln in out.splitlines() if "messages acked" in ln), "")
        return {"code": daemon.returncode, "exit_s": exited - sent,
                "drain_s": marks.get("drained", float("nan")) - sent,
                "stop_s": exited - marks.get("drained", float("nan")),
                "after_log_s": exited - marks.get("stopped", float("nan")),
                "summary": acked_line.strip(), "stderr": err}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--after", type=float, default=1.0,
                    help="seconds of running (after the first ack) before SIGTERM")
    ap.add_argument("--no-metrics", action="store_true", help="turn the /metrics server off")
    args = ap.parse_args()
    print(f"load: {os.getloadavg()}", flush=True)
    runs = []
    for i in range(args.runs):
        r = one_run(args.after, not args.no_metrics)
        runs.append(r)
        print(f"run {i + 1}: exit {r['exit_s'] * 1000:6.0f} ms after SIGTERM (drain "
              f"{r['drain_s'] * 1000:5.0f} ms, then stop {r['stop_s'] * 1000:5.0f} ms; "
              f"code {r['code']}) {r['summary']}", flush=True)
        if r["code"] != 0:
            print(r["stderr"][-3000:], file=sys.stderr)
    exits = [r["exit_s"] * 1000 for r in runs]
    print(f"median exit {statistics.median(exits):.0f} ms [{min(exits):.0f}..{max(exits):.0f}]"
          f" over {len(runs)} runs; drain median "
          f"{statistics.median(r['drain_s'] * 1000 for r in runs):.0f} ms, stop median "
          f"{statistics.median(r['stop_s'] * 1000 for r in runs):.0f} ms")
    print(f"load: {os.getloadavg()}")


if __name__ == "__main__":
    main()
