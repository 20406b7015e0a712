"""The README's pipeline end to end into Spark, beside the script a user would write instead.

    .venv/bin/python bench/spark_e2e.py [--lines 1000000] [--rounds 2] [--no-rabbitmq]
                                        [--references PATH] [--commit ROWS/SECONDS]
                                        [--once on|off|both] [--keep]

The rows are ``--lines`` order lines like ``examples/spool`` (``{"order", "sku", "qty",
"unit_price"}``), priced by ``examples/orders.py``.  Per round, interleaved:

* **pipeline, spool**: ``config/example.toml`` as shipped, run with ``--until-idle`` in a
  directory of its own holding ``var/spool`` (so the config's own relative paths are
  used), with two changes: the metrics listener off and ``[spark] remote`` + ``token_env``
  pointing at one Spark Connect server the bench starts exactly as the daemon starts its
  own (argv and env from ``offbroadway.daemon.spark.wiring.plan``), so every run pays the same
  warm JVM.  Timed from the daemon's "pipeline … is up" log line (the producer fetches
  from then on) to the modification time of the last Parquet file Spark wrote; rows
  counted in the dataset.  Per stage, the CPU seconds its processes used from the
  pipeline's start on (sampled from ``/proc`` through the status tree; what they spent
  before it was up, importing and setting up, is left out, as the references leave out
  their session's start), and the Spark server JVM's over the same span, in µs per row.
* **the references**: ``spark_references.py SPOOL 1`` on the same spool files, run as it
  is in a subprocess (its own classic ``local[2]`` session): ``loop``, the twenty-line
  consumer a user would write instead (``json.loads``, price, 100k-row batches →
  ``createDataFrame`` → Parquet), and ``alone``, Spark's own write speed for the same rows
  pre-parsed.  The yardsticks sit beside the repository (``../shared/bench/``, or
  ``--references PATH``), not in it: without them the bench runs the pipeline alone and
  says so.
* **pipeline, RabbitMQ** (after the rounds unless ``--no-rabbitmq``; ``--rabbitmq-rounds``
  of them): the same config with the RabbitMQ source (``prefetch_count = "auto"``) on a
  queue preloaded with the same lines, each body's JSON decoded by the source
  (``decode = "json"``) for the example's own handler; each beside a run of
  ``rabbitmq_spark_reference.py SPOOL 1`` (the plain pika consumer a user would write
  instead, beside the repository as well, or ``--rabbitmq-reference PATH``), the order
  swapped every round: the ratio per round and its median.

``--commit ROWS/SECONDS`` adds, per round, the spool pipeline with ``[spark]
commit_rows`` and ``commit_interval`` set so: how the commit size moves the JVM's cost.

``--once both`` runs, per round, the spool pipeline as shipped (``[spark] exactly_once``
on, its default) and the same with ``exactly_once = false`` (no journal of commit stamps,
no check of ids in doubt), one after the other, the order swapped every round: prints
both rates, their ratio (off / on) and the committer's and the JVM's CPU per row of each,
so that the cost of the mechanism shows (use an even number of rounds: the first run
warms the JVM, and the swap gives each side that once).  ``--once off`` runs the shipped
config with the mechanism off instead (``on``, the default, as shipped).

Prints each run, the ratios per round (pipeline / loop, pipeline / alone), the medians,
and the per-stage CPU per row.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import sample_cpu, status, statuses  # bench/ helpers
from spark_sink import _env, start_server

REPO = Path(__file__).resolve().parent.parent
REFERENCES = REPO.parent / "shared" / "bench" / "spark_references.py"
RABBIT_REFERENCE = REPO.parent / "shared" / "bench" / "rabbitmq_spark_reference.py"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
TOKEN_ENV = "OB_BENCH_SPARK_TOKEN"
UP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*pipeline \S+ is up", re.M)
SKUS = ("apple", "plum", "kiwi", "fig", "pear", "mango", "lime", "date")
ROLES = ("producer", "processor", "batcher", "batch_processor", "committer", "jvm")


def order_lines(n: int) -> list[str]:
    rnd = random.Random(7)
    return [json.dumps({"order": i, "sku": rnd.choice(SKUS), "qty": rnd.randint(1, 9),
                        "unit_price": round(rnd.uniform(0.2, 4.0), 2)}) for i in range(n)]


def write_spool(spool: Path, lines: list[str], files: int = 10) -> None:
    spool.mkdir(parents=True, exist_ok=True)
    per = (len(lines) + files - 1) // files
    for f in range(files):
        chunk = lines[f * per:(f + 1) * per]
        (spool / f"orders-{f:04d}.jsonl").write_text("\n".join(chunk) + "\n")


def example_config(remote: str, *, rabbit_queue: str | None = None,
                   commit: tuple[int, float] | None = None, once: bool = True) -> str:
    text = (REPO / "config" / "example.toml").read_text()
    if not once:
        text = text.replace("[spark]\n", "[spark]\nexactly_once = false\n")
    if commit is not None:
        text = text.replace("[spark]\n", f"[spark]\ncommit_rows = {commit[0]}\n"
                                         f"commit_interval = {commit[1]}\n")
    text = text.replace('listen = "127.0.0.1:9464"', 'listen = ""')
    text = text.replace("[spark]\n", f"[spark]\nremote = {json.dumps(remote)}\n"
                                     f"token_env = {json.dumps(TOKEN_ENV)}\n")
    if rabbit_queue is not None:
        # the example's own handler: the source decodes each body's JSON (``decode``,
        # docs/sources.md), as a user of the README's config with RabbitMQ would set it
        text = text.replace('source = "spool"', 'source = "rabbitmq"')
        text = text.replace('path = "var/spool"',
                            f'url = "{AMQP_URL}"\nqueue = "{rabbit_queue}"\n'
                            f'prefetch_count = "auto"\ndecode = "json"')
    return text


def cpu_seconds(pid: int) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system + t.children_user + t.children_system
    except psutil.Error:
        return 0.0


def run_pipeline(workdir: Path, config_text: str, token: str, jvm: int) -> dict[str, Any]:
    """One ``--until-idle`` run: rate, and per role the CPU µs per row."""
    import pyarrow.parquet as pq

    config = workdir / "bench.toml"
    config.write_text(config_text)
    env = {**_env(), TOKEN_ENV: token, "PYTHONPATH": f"{REPO}:{workdir}"}
    jvm0 = cpu_seconds(jvm)
    t0 = time.time()
    with open(workdir / "daemon.out", "w+") as fout, open(workdir / "daemon.err", "w+") as ferr:
        daemon = subprocess.Popen([sys.executable, "-m", "offbroadway.daemon.cli", "run",
                                   str(config), "--until-idle"], cwd=workdir, env=env,
                                  stdout=fout, stderr=ferr, text=True)
        seen: dict[int, tuple[str, float, float, float]] = {}
        # the CPU the stages and the JVM had spent before the pipeline was up (imports,
        # set-up, the JVM's idle ticks): the last sample taken before the "is up" line,
        # so that, like the rate, the CPU counts from then on (as the references count
        # theirs over their timed part only); a stage not seen yet counts from 0
        base: dict[int, tuple[str, float, float, float]] = {}
        sock = str(workdir / "var" / "run" / "control.sock")
        while daemon.poll() is None:
            s = status(sock)
            if s is not None:
                sample_cpu(s["tree"], seen)
            # read by name: the daemon writes through this very file description, whose
            # offset a seek here would move
            if UP.search((workdir / "daemon.err").read_text(errors="replace")):
                break
            base, jvm0 = dict(seen), cpu_seconds(jvm)
            time.sleep(0.02)
        for status_ in statuses(daemon, sock, 0.5):
            sample_cpu(status_["tree"], seen)
        daemon.wait(timeout=3600)
        wall = time.time() - t0
        jvm_cpu = cpu_seconds(jvm) - jvm0
        fout.seek(0)
        ferr.seek(0)
        out, stderr = fout.read(), ferr.read()
    if daemon.returncode != 0:
        raise SystemExit(f"pipeline failed ({daemon.returncode}):\n{stderr[-3000:]}")
    up = UP.search(stderr)
    assert up, stderr[-2000:]
    start = datetime.strptime(up[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    dataset = workdir / "var" / "orders" / "spark"
    files = list(dataset.rglob("*.parquet"))
    if not files:
        raise SystemExit(f"no rows written:\n{out[-2000:]}\n{stderr[-2000:]}")
    last = max(p.stat().st_mtime for p in files)
    rows = pq.read_table(dataset).num_rows
    wrote = re.search(r"wrote (\d+) rows", out)
    cpu: dict[str, float] = dict.fromkeys(ROLES, 0.0)
    for pid, (role, total, _io, _sys) in seen.items():
        key = "committer" if role.startswith("committer") else role
        if key in cpu:
            cpu[key] += total - (base[pid][1] if pid in base else 0.0)
    cpu["jvm"] = jvm_cpu
    return {"rows": rows, "seconds": last - start, "rate": rows / (last - start),
            "wall": wall, "files": len(files), "printed": wrote[0] if wrote else "",
            "load": os.getloadavg()[0],
            "us_per_row": {k: v * 1e6 / max(rows, 1) for k, v in cpu.items()}}


def references(script: Path, spool: Path) -> dict[str, float]:
    """``spark_references.py SPOOL 1``, run as it is: {"loop": rows/s, "alone": rows/s,
    "cpu loop": its CPU µs per row, "cpu alone": …} (the CPU figures when it prints them)."""
    proc = subprocess.run([sys.executable, str(script), str(spool), "1"], env=_env(),
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"references failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    found = dict(re.findall(r"^median (\w+) (\d+)", proc.stdout, re.M))
    found |= {f"cpu {k}": v for k, v in
              re.findall(r"^cpu per row (\w+) ([\d.]+) us", proc.stdout, re.M)}
    return {k: float(v) for k, v in found.items()} | {"load": os.getloadavg()[0]}


def rabbit_reference(script: Path, spool: Path) -> dict[str, float]:
    """``rabbitmq_spark_reference.py SPOOL 1``, run as it is (it publishes the lines
    itself): {"rate": rows/s, "cpu": its CPU µs per row}."""
    proc = subprocess.run([sys.executable, str(script), str(spool), "1", AMQP_URL],
                          env=_env(), capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"rabbitmq reference failed ({proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    rate = re.search(r"^median rabbitmq loop (\d+)", proc.stdout, re.M)
    cpu = re.search(r"^cpu per row rabbitmq loop ([\d.]+) us", proc.stdout, re.M)
    assert rate, proc.stdout[-2000:]
    return {"rate": float(rate[1]), "cpu": float(cpu[1]) if cpu else float("nan"),
            "load": os.getloadavg()[0]}


def preload(queue: str, lines: list[str]) -> None:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    ch = conn.channel()
    ch.queue_declare(queue)
    for i, line in enumerate(lines):
        ch.basic_publish("", queue, line.encode(), pika.BasicProperties(message_id=f"o{i}"))
    conn.process_data_events(time_limit=0)
    conn.close()


def delete_queue(queue: str) -> None:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    conn.channel().queue_delete(queue)
    conn.close()


def show(name: str, r: dict[str, Any]) -> None:
    per = "  ".join(f"{k} {v:.1f}" for k, v in r["us_per_row"].items())
    print(f"{name}: {r['rows']} rows in {r['seconds']:.1f} s = {r['rate']:,.0f} rows/s, "
          f"load {r['load']:.1f} ({r['printed']}; {r['files']} files; wall {r['wall']:.1f} s)"
          f"\n    CPU us/row: {per}  (Python stages "
          f"{sum(v for k, v in r['us_per_row'].items() if k != 'jvm'):.1f})", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-rabbitmq", action="store_true")
    ap.add_argument("--references", type=Path, default=REFERENCES)
    ap.add_argument("--rabbitmq-rounds", type=int, default=1,
                    help="RabbitMQ runs after the spool rounds, each beside a run of "
                         "rabbitmq_spark_reference.py on the same lines (order swapped "
                         "every round)")
    ap.add_argument("--rabbitmq-reference", type=Path, default=RABBIT_REFERENCE)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--commit", metavar="ROWS/SECONDS", default=None,
                    help="also run the spool pipeline with [spark] commit_rows and "
                         "commit_interval set so (e.g. 200000/3), interleaved")
    ap.add_argument("--once", choices=("on", "off", "both"), default="on",
                    help="[spark] exactly_once of the spool runs: on (as shipped), off, or "
                         "both interleaved in each round (their ratio: the mechanism's cost)")
    args = ap.parse_args()

    refs = args.references if args.references.is_file() else None
    if refs is None:
        print(f"no yardsticks at {args.references}: the pipeline alone, no ratios", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="spark-e2e-"))
    print(f"load before: {os.getloadavg()}; dir {tmp}", flush=True)
    lines = order_lines(args.lines)
    (tmp / "server").mkdir()
    server, bp_env, jvm, ready = start_server(tmp / "server")
    remote, token = bp_env["OFFBROADWAY_SPARK_REMOTE"], bp_env["OFFBROADWAY_SPARK_TOKEN"]
    print(f"Spark Connect server ready in {ready:.1f} s", flush=True)
    runs: list[dict[str, Any]] = []
    loops: list[float] = []
    alones: list[float] = []
    rabbit: dict[str, Any] | None = None
    rabbits: list[dict[str, Any]] = []
    rabbit_refs: list[dict[str, Any]] = []
    varied: list[dict[str, Any]] = []
    #: with --once both: the runs with exactly_once off (``runs`` holds those with it on)
    unonce: list[dict[str, Any]] = []
    try:
        for rnd in range(args.rounds):
            spool_copy = tmp / f"refs-{rnd}"
            write_spool(spool_copy, lines)
            modes = {"on": [True], "off": [False], "both": [True, False]}[args.once]
            for once in modes if rnd % 2 == 0 else modes[::-1]:
                work = tmp / f"spool-{rnd}-{'on' if once else 'off'}"
                write_spool(work / "var" / "spool", lines)
                r = run_pipeline(work, example_config(remote, once=once), token, jvm)
                (runs if once or args.once == "off" else unonce).append(r)
                show(f"round {rnd + 1}: pipeline, spool, config/example.toml"
                     f"{'' if once else ', exactly_once = false'}", r)
                if not args.keep:
                    shutil.rmtree(work, ignore_errors=True)
            if unonce:
                on, off = runs[-1], unonce[-1]
                print(f"round {rnd + 1}: exactly_once off / on {off['rate'] / on['rate']:.3f};"
                      f" CPU us/row on -> off: committer {on['us_per_row']['committer']:.2f}"
                      f" -> {off['us_per_row']['committer']:.2f}, JVM "
                      f"{on['us_per_row']['jvm']:.2f} -> {off['us_per_row']['jvm']:.2f}",
                      flush=True)
            r = runs[-1]
            if refs is not None:
                ref = references(refs, spool_copy)
                loops.append(ref["loop"])
                alones.append(ref["alone"])
                print(f"round {rnd + 1}: references: loop {ref['loop']:,.0f} rows/s, alone "
                      f"{ref['alone']:,.0f} rows/s (load {ref['load']:.1f}); pipeline / loop "
                      f"{r['rate'] / ref['loop']:.2f}, pipeline / alone "
                      f"{r['rate'] / ref['alone']:.2f}", flush=True)
                if "cpu loop" in ref:
                    mine = sum(r["us_per_row"].values())
                    print(f"round {rnd + 1}: CPU us/row, every process and the JVM: pipeline "
                          f"{mine:.1f}, loop {ref['cpu loop']:.1f} ({mine / ref['cpu loop']:.2f}x"
                          f"), alone {ref.get('cpu alone', float('nan')):.1f}", flush=True)
            shutil.rmtree(spool_copy, ignore_errors=True)
            if args.commit:
                rows, secs = args.commit.split("/")
                work = tmp / f"spool-commit-{rnd}"
                write_spool(work / "var" / "spool", lines)
                r = run_pipeline(work, example_config(remote, commit=(int(rows), float(secs))),
                                 token, jvm)
                varied.append(r)
                show(f"round {rnd + 1}: pipeline, spool, commit {args.commit}", r)
                if loops:
                    print(f"    / loop {r['rate'] / loops[-1]:.2f}", flush=True)
                if not args.keep:
                    shutil.rmtree(work, ignore_errors=True)
        rabbit_ref = args.rabbitmq_reference if args.rabbitmq_reference.is_file() else None
        if not args.no_rabbitmq and rabbit_ref is None:
            print(f"no RabbitMQ yardstick at {args.rabbitmq_reference}: the pipeline alone",
                  flush=True)
        for rnd in range(0 if args.no_rabbitmq else args.rabbitmq_rounds):
            def pipeline_run(rnd: int = rnd) -> dict[str, Any]:
                queue = f"spark-e2e-{os.getpid()}-{rnd}"
                t0 = time.monotonic()
                preload(queue, lines)
                print(f"published {len(lines)} lines in {time.monotonic() - t0:.1f} s",
                      flush=True)
                try:
                    work = tmp / f"rabbit-{rnd}"
                    work.mkdir()
                    r = run_pipeline(work, example_config(remote, rabbit_queue=queue), token,
                                     jvm)
                    show(f"rabbitmq round {rnd + 1}: pipeline, RabbitMQ, config/example.toml",
                         r)
                    return r
                finally:
                    delete_queue(queue)
                    if not args.keep:
                        shutil.rmtree(tmp / f"rabbit-{rnd}", ignore_errors=True)

            def reference_run(rnd: int = rnd) -> dict[str, Any] | None:
                if rabbit_ref is None:
                    return None
                spool = tmp / f"rabbit-refs-{rnd}"
                write_spool(spool, lines)
                try:
                    return rabbit_reference(rabbit_ref, spool)
                finally:
                    shutil.rmtree(spool, ignore_errors=True)

            if rnd % 2 == 0:
                r, ref = pipeline_run(), reference_run()
            else:
                ref = reference_run()
                r = pipeline_run()
            rabbits.append(r)
            rabbit = r
            if ref is not None:
                rabbit_refs.append(ref)
                mine = sum(r["us_per_row"].values())
                print(f"rabbitmq round {rnd + 1}: reference {ref['rate']:,.0f} rows/s (load "
                      f"{ref['load']:.1f}); pipeline / reference {r['rate'] / ref['rate']:.2f}"
                      f"; CPU us/row pipeline {mine:.1f} (the broker's not included), "
                      f"reference {ref['cpu']:.1f} ({mine / ref['cpu']:.2f}x)", flush=True)
    finally:
        server.terminate()
        server.wait(60)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    # --rounds 0: RabbitMQ rounds only, no spool run to sum up
    med = statistics.median(r["rate"] for r in runs) if runs else 0.0
    print("\n| run | rounds | median rows/s | / loop | / alone |"
          "\n| --- | ---: | ---: | ---: | ---: |")
    loop = statistics.median(loops) if loops else None
    alone = statistics.median(alones) if alones else None

    def ratio(x: float, ref: float | None) -> str:
        return f"{x / ref:.2f}" if ref else "-"

    shipped = "pipeline, spool" + (", exactly_once = false" if args.once == "off" else "")
    if runs:
        print(f"| {shipped} | {len(runs)} | {med:,.0f} | {ratio(med, loop)} | "
              f"{ratio(med, alone)} |")
    if unonce:
        u = statistics.median(r["rate"] for r in unonce)
        print(f"| pipeline, spool, exactly_once = false | {len(unonce)} | {u:,.0f} | "
              f"{ratio(u, loop)} | {ratio(u, alone)} |")
    if varied:
        v = statistics.median(r["rate"] for r in varied)
        print(f"| pipeline, spool, commit {args.commit} | {len(varied)} | {v:,.0f} | "
              f"{ratio(v, loop)} | {ratio(v, alone)} |")
    if rabbit is not None:
        rm = statistics.median(r["rate"] for r in rabbits)
        print(f"| pipeline, RabbitMQ | {len(rabbits)} | {rm:,.0f} | {ratio(rm, loop)}"
              f" | {ratio(rm, alone)} |")
    if rabbit_refs:
        ratios = [r["rate"] / f["rate"] for r, f in zip(rabbits, rabbit_refs)]
        print(f"\nRabbitMQ: pipeline / rabbitmq_spark_reference per round "
              f"{', '.join(f'{x:.2f}' for x in ratios)}, median {statistics.median(ratios):.2f}"
              f"; reference median {statistics.median(f['rate'] for f in rabbit_refs):,.0f} "
              f"rows/s, CPU us/row {statistics.median(f['cpu'] for f in rabbit_refs):.1f}; "
              f"pipeline per stage: " + "  ".join(
                  f"{k} {statistics.median(r['us_per_row'][k] for r in rabbits):.1f}"
                  for k in ROLES))
    if loop:
        print(f"| references: loop | {len(loops)} | {loop:,.0f} | 1.00 | {ratio(loop, alone)} |")
        print(f"| references: alone | {len(alones)} | {alone:,.0f} | | 1.00 |")
    if runs:
        print("\nper stage, median CPU us/row (spool runs): " + "  ".join(
            f"{k} {statistics.median(r['us_per_row'][k] for r in runs):.1f}" for k in ROLES))
    if unonce:
        print("per stage, median CPU us/row (exactly_once = false): " + "  ".join(
            f"{k} {statistics.median(r['us_per_row'][k] for r in unonce):.1f}" for k in ROLES))
        ratios = [off["rate"] / on["rate"] for on, off in zip(runs, unonce)]

        def cpu(rs: list[dict[str, Any]], k: str) -> float:
            return statistics.median(r["us_per_row"][k] for r in rs)

        print(f"exactly_once: off / on per round {', '.join(f'{x:.3f}' for x in ratios)}; "
              f"median rows/s on {med:,.0f}, off {u:,.0f}, off / on {u / med:.3f}; median "
              f"CPU us/row committer on {cpu(runs, 'committer'):.2f} off "
              f"{cpu(unonce, 'committer'):.2f}, JVM on {cpu(runs, 'jvm'):.2f} off "
              f"{cpu(unonce, 'jvm'):.2f}")
    if varied:
        print(f"per stage, median CPU us/row (commit {args.commit}): " + "  ".join(
            f"{k} {statistics.median(r['us_per_row'][k] for r in varied):.1f}"
            for k in ROLES))
    print(f"\nload after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
