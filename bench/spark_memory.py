"""The memory the README's pipeline holds with a full window: Spark stalled, every stage fed.

    .venv/bin/python bench/spark_memory.py [--lines 600000] [--commit ROWS/SECONDS] [--keep]

Not a timing: it runs once.  ``config/example.toml`` as shipped (as in
``bench/spark_e2e.py``: metrics off, ``[spark] remote`` to one Connect server this script
starts exactly as the daemon starts its own), on a spool of ``--lines`` order lines, more
than the pipeline can hold.  Once the first Spark job committed, the server's JVM is
stopped (SIGSTOP): no job ends, no batch is answered, so the batch processors keep every
batch they asked for (two commit groups' worth) and the stages upstream fill to their
demand.  When the producer's count of messages in flight has not grown for
``--settle`` seconds, the window is full: the RSS of every stage process is read (and
the bytes staged on disk), then the JVM is resumed (SIGCONT) and the run finishes.

Prints, per role, the RSS at the start (first status), at the full window and the peak
over the run, the messages in flight, and the staged Parquet on disk.
``--commit 50000/1`` runs the same with the former defaults, for comparison.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import role, status  # bench/ helpers
from offbroadway.supervision.tree import snapshot_nodes
from spark_e2e import REPO, TOKEN_ENV, example_config, order_lines, write_spool
from spark_sink import _env, start_server

ROLES = ("producer", "processor", "batcher", "batch_processor", "committer")


def rss_by_role(tree: dict) -> dict[str, float]:
    """MiB of resident memory per role, summed over its processes."""
    out = dict.fromkeys(ROLES, 0.0)
    for n in snapshot_nodes(tree):
        pid = n.get("pid")
        if not pid or n.get("kind") != "worker":
            continue
        r = "committer" if n["id"].startswith("committer") else role(n["id"])
        if r not in out:
            continue
        try:
            out[r] += psutil.Process(pid).memory_info().rss / 2**20
        except psutil.Error:
            pass
    return out


def inflight(tree: dict) -> int:
    return sum(n.get("messages", {}).get("inflight", 0) for n in snapshot_nodes(tree)
               if role(n["id"]) == "producer")


def committed(tree: dict) -> int:
    return sum(n.get("messages", {}).get("commits", 0) for n in snapshot_nodes(tree)
               if n["id"].startswith("committer"))


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=600_000)
    ap.add_argument("--commit", metavar="ROWS/SECONDS", default=None)
    ap.add_argument("--settle", type=float, default=5.0)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    commit = None
    if args.commit:
        rows, secs = args.commit.split("/")
        commit = (int(rows), float(secs))

    tmp = Path(tempfile.mkdtemp(prefix="spark-memory-"))
    print(f"load before: {os.getloadavg()}; dir {tmp}", flush=True)
    (tmp / "server").mkdir()
    server, bp_env, jvm, ready = start_server(tmp / "server")
    print(f"Spark Connect server ready in {ready:.1f} s", flush=True)
    work = tmp / "run"
    write_spool(work / "var" / "spool", order_lines(args.lines))
    config = work / "bench.toml"
    config.write_text(example_config(bp_env["OFFBROADWAY_SPARK_REMOTE"], commit=commit))
    env = {**_env(), TOKEN_ENV: bp_env["OFFBROADWAY_SPARK_TOKEN"],
           "PYTHONPATH": f"{REPO}:{work}"}
    sock = str(work / "var" / "run" / "control.sock")
    stopped = False
    first: dict[str, float] | None = None
    peak = dict.fromkeys(ROLES, 0.0)
    full: dict[str, float] = {}
    held = staged = 0
    try:
        with open(work / "daemon.out", "w") as fout, open(work / "daemon.err", "w") as ferr:
            daemon = subprocess.Popen([sys.executable, "-m", "offbroadway.daemon.cli", "run",
                                       str(config), "--until-idle"], cwd=work, env=env,
                                      stdout=fout, stderr=ferr)
            best, since = -1, time.monotonic()
            while daemon.poll() is None:
                st = status(sock)
                if st is None:
                    time.sleep(0.1)
                    continue
                tree = st["tree"]
                now = rss_by_role(tree)
                if first is None and all(now.values()):
                    first = now
                peak = {k: max(peak[k], now[k]) for k in ROLES}
                if not stopped and committed(tree) > 0:
                    os.kill(jvm, signal.SIGSTOP)
                    stopped = True
                    best, since = inflight(tree), time.monotonic()
                    print(f"first commit: the JVM stopped, {best:,} in flight", flush=True)
                elif stopped and not full:
                    n = inflight(tree)
                    if n > best:
                        best, since = n, time.monotonic()
                    elif time.monotonic() - since >= args.settle:
                        full, held = now, n
                        staged = du(work / "var" / "state" / "spark-staging")
                        print(f"window full: {held:,} in flight; the JVM resumed", flush=True)
                        os.kill(jvm, signal.SIGCONT)
                time.sleep(0.5)
        if stopped and not full:
            os.kill(jvm, signal.SIGCONT)
        if daemon.returncode != 0:
            raise SystemExit(f"pipeline failed ({daemon.returncode}):\n"
                             f"{(work / 'daemon.err').read_text()[-3000:]}")
    finally:
        try:
            os.kill(jvm, signal.SIGCONT)
        except ProcessLookupError:
            pass
        server.terminate()
        server.wait(60)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    shown = args.commit or "as shipped"
    print(f"\nconfig/example.toml, commit {shown}, {args.lines:,} lines; {held:,} messages "
          f"in flight at the full window; staged Parquet {staged / 2**20:.1f} MiB on disk")
    print("| role | RSS at start MiB | at the full window MiB | peak MiB |\n"
          "| --- | ---: | ---: | ---: |")
    for k in ROLES:
        print(f"| {k} | {(first or {}).get(k, 0):.0f} | {full.get(k, 0):.0f} | {peak[k]:.0f} |")
    print(f"| all stages | {sum((first or {}).values()):.0f} | {sum(full.values()):.0f} | "
          f"{sum(peak.values()):.0f} |")
    print(f"\nload after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
