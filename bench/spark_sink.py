"""Rows/s and writes/s into Parquet through SparkSink, beside pyarrow alone and classic PySpark.

    .venv/bin/python bench/spark_sink.py [--sizes 1000 10000 100000] [--writers 1 2]
                                         [--no-classic] [--keep DIR]

One run, same rows everywhere: ``{"seq": n, "payload": <100 chars>}`` as the generator
source emits them, ids ``producer_0-<n>``.  Per batch size:

* **SparkSink**: a Spark Connect server started exactly as the daemon starts it (argv and
  env from ``offbroadway.daemon.spark.wiring.plan``, ready on the notify pipe), and 1 or 2 writer
  processes (each ``SparkSink.write`` per batch: one Spark job per batch, committed into
  one shared dataset through a staging directory per job).  Timed: ``write()`` only
  (dict → Arrow conversion, Connect transfer, the Spark job and its commit); the
  Message objects are built untimed, one batch at a time, as a batch processor
  receives them.  Each writer first writes 1k-row batches untimed for 10 s (JIT
  warm-up: steady state is what a daemon lives in), then one untimed write per size.
* **pyarrow.parquet**: the same dicts → the same Arrow table (plus ``message_id`` and
  ``ingested_at``) → ``pq.write_table`` into a new file per batch: the physical limit.
* **classic PySpark**: one ``local[2]`` session in its own process (its own JVM), the same
  Arrow table → ``createDataFrame`` → ``write.parquet(mode=append)``.

Peak RSS: the Connect server JVM (sampled every 100 ms with psutil), each writer process
(``ru_maxrss``), the classic Python process and its JVM.  Every written dataset is read
back and counted.  Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from offbroadway.daemon.config.names import batch_processor_id

REPO = Path(__file__).resolve().parent.parent
PAYLOAD = ("abcdefghijklmnopqrstuvwxyz0123456789" * 3)[:100]


def _writes_for(size: int) -> int:
    """Enough writes per size for a stable rate in a few seconds each."""
    return {1000: 40, 10000: 20, 100000: 6}.get(size, max(3, 400_000 // size))


def _batches(size: int, n: int, prefix: str) -> list[list[dict[str, Any]]]:
    return [[{"seq": b * size + i, "payload": PAYLOAD} for i in range(size)] for b in range(n)]


def _summary(size: int, times: list[float]) -> dict[str, Any]:
    total = sum(times)
    return {"size": size, "writes": len(times), "rows": size * len(times), "seconds": total,
            "rows_per_s": size * len(times) / total, "writes_per_s": len(times) / total,
            "p50_ms": statistics.median(times) * 1000}


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- workers (each in its own process, for a clean peak RSS) -------------------------------

def worker_sink(out: str, writer: str, sizes: list[int], start_at: float) -> dict[str, Any]:
    from offbroadway import Message
    from offbroadway.stages.spark.spark_sink import SparkSink

    sink = SparkSink(output=out, writer_id=writer)
    _warm_jit(lambda rows: sink.write("warmup", [Message(f"{writer}-j{r['seq']}-{time.time()}", r)
                                                 for r in rows]))
    results = []
    for size in sizes:
        warm = [Message(f"{writer}-warm{size}-{i}", {"seq": i, "payload": PAYLOAD})
                for i in range(size)]
        sink.write(f"b{size}", warm)
        assert all(m.status is None for m in warm), warm[0].status
        while time.time() < start_at:      # writers of a size start together
            time.sleep(0.01)
        times = []
        for b in range(_writes_for(size)):
            # built untimed, one batch at a time, as a batch processor holds one batch
            batch = [Message(f"{writer}-{size}-{b * size + i}",
                             {"seq": b * size + i, "payload": PAYLOAD}) for i in range(size)]
            t = time.perf_counter()
            sink.write(f"b{size}", batch)
            times.append(time.perf_counter() - t)
            failed = [m.status for m in batch if m.status is not None]
            assert not failed, failed[:3]
        results.append(_summary(size, times))
        start_at = time.time() + 1.0
    sink.close()
    return {"results": results, "rss_mb": _maxrss_mb()}


WARMUP_SECONDS = 10.0


def _warm_jit(write) -> None:
    """Untimed 1k-row writes for a while: a fresh JVM's first ~50 writes are 2-3x slower
    (JIT), and a daemon lives far longer than that.  Steady state is what we compare."""
    deadline = time.monotonic() + WARMUP_SECONDS
    while time.monotonic() < deadline:
        write(_batches(1000, 1, "j")[0])


def _arrow_table(rows: list[dict[str, Any]], ids: list[str]):
    import pyarrow as pa

    now = datetime.now(UTC)
    return pa.table({
        "seq": pa.array([r["seq"] for r in rows]),
        "payload": pa.array([r["payload"] for r in rows]),
        "message_id": pa.array(ids, pa.string()),
        "ingested_at": pa.repeat(pa.scalar(now, pa.timestamp("us", tz="UTC")), len(rows)),
    })


def worker_pyarrow(out: str, sizes: list[int]) -> dict[str, Any]:
    import pyarrow.parquet as pq

    results = []
    for size in sizes:
        target = Path(out) / f"b{size}"
        target.mkdir(parents=True, exist_ok=True)
        times = []
        for n in range(_writes_for(size)):
            rows = _batches(size, 1, "pa")[0]
            ids = [f"pa-{size}-{r['seq']}" for r in rows]
            t = time.perf_counter()
            pq.write_table(_arrow_table(rows, ids), target / f"part-{n:05d}.parquet")
            times.append(time.perf_counter() - t)
        results.append(_summary(size, times))
    return {"results": results, "rss_mb": _maxrss_mb()}


def worker_classic(out: str, sizes: list[int]) -> dict[str, Any]:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    t0 = time.perf_counter()
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("bench-classic")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
    spark.range(1).count()
    started = time.perf_counter() - t0
    jvm = [c for c in psutil.Process().children(recursive=True) if "java" in c.name()]
    peak = {"jvm": 0.0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for p in jvm:
                try:
                    peak["jvm"] = max(peak["jvm"], p.memory_info().rss / 2**20)
                except psutil.Error:
                    pass
            stop.wait(0.1)

    threading.Thread(target=sample, daemon=True).start()
    _warm_jit(lambda rows: spark.createDataFrame(
        _arrow_table(rows, [str(r["seq"]) for r in rows])).write.mode("append")
        .parquet(f"{out}/warmup"))
    results = []
    for size in sizes:
        path = f"{out}/b{size}"
        warm = _batches(size, 1, "w")[0]
        spark.createDataFrame(_arrow_table(warm, [f"w-{r['seq']}" for r in warm])) \
            .write.mode("append").parquet(path)
        times = []
        for _ in range(_writes_for(size)):
            rows = _batches(size, 1, "c")[0]
            ids = [f"c-{size}-{r['seq']}" for r in rows]
            t = time.perf_counter()
            spark.createDataFrame(_arrow_table(rows, ids)).write.mode("append").parquet(path)
            times.append(time.perf_counter() - t)
        results.append(_summary(size, times))
        assert spark.read.parquet(path).count() == size * (len(times) + 1)
    stop.set()
    spark.stop()
    return {"results": results, "rss_mb": _maxrss_mb(), "jvm_rss_mb": peak["jvm"],
            "start_s": started}


# -- the driver ------------------------------------------------------------------------------

def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _run_worker(args: list[str], env: dict[str, str] | None = None,
                stderr: Path | None = None) -> subprocess.Popen:
    """A worker process; its stderr (JVM chatter for the classic one) to a file if given."""
    err = open(stderr, "ab") if stderr else None
    try:
        return subprocess.Popen([sys.executable, __file__, "--worker", *args],
                                env=env or _env(), stdout=subprocess.PIPE, stderr=err,
                                text=True)
    finally:
        if err:
            err.close()


def _collect(proc: subprocess.Popen) -> dict[str, Any]:
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"worker failed with {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def start_server(root: Path) -> tuple[subprocess.Popen, dict[str, str], int, float]:
    from offbroadway.daemon.config.records import SparkConfig
    from offbroadway.daemon.spark.wiring import plan
    from offbroadway.supervision.child import NOTIFY_FD_ENV

    p = plan(SparkConfig(output=str(root / "out")), runtime_dir=str(root),
             state_dir=str(root / "state"))
    assert p.child is not None
    r, w = os.pipe()
    env = {**_env(), **p.child.env(), NOTIFY_FD_ENV: str(w)}  # type: ignore[operator]
    t0 = time.monotonic()
    proc = subprocess.Popen(list(p.child.argv), env=env, pass_fds=(w,),
                            stdout=open(root / "server.out", "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    os.close(w)
    got = b""
    while b"R" not in got:
        if proc.poll() is not None:
            raise SystemExit((root / "server.out").read_text())
        if select.select([r], [], [], 1.0)[0]:
            got += os.read(r, 64)
    ready = time.monotonic() - t0

    def drain() -> None:
        while os.read(r, 1024):
            pass

    threading.Thread(target=drain, daemon=True).start()
    jvm = int((root / "state" / "spark" / "spark-connect.pid").read_text())
    return proc, p.committer_env(), jvm, ready


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--writers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--no-classic", action="store_true")
    ap.add_argument("--keep", help="write datasets here and keep them")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.worker:
        kind, out, *rest = a.worker
        if kind == "sink":
            result = worker_sink(out, rest[0], a.sizes, float(rest[1]))
        elif kind == "pyarrow":
            result = worker_pyarrow(out, a.sizes)
        else:
            result = worker_classic(out, a.sizes)
        print(json.dumps(result))
        return 0

    root = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="ob-bench-spark-"))
    root.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()[0]
    rows: list[tuple[str, dict[str, Any]]] = []
    notes: list[str] = []
    try:
        pa_res = _collect(_run_worker(["pyarrow", str(root / "pyarrow"), "--sizes",
                                       *map(str, a.sizes)]))
        rows += [("pyarrow.parquet (1 process)", r) for r in pa_res["results"]]
        notes.append(f"load average during pyarrow: {os.getloadavg()[0]:.1f}")
        notes.append(f"pyarrow writer process peak RSS {pa_res['rss_mb']:.0f} MB")

        server, bp_env, jvm_pid, ready = start_server(root)
        notes.append(f"Connect server ready (port + probe query + warm-up write) in {ready:.1f} s")
        jvm = psutil.Process(jvm_pid)
        peak = {"jvm": 0.0}
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                try:
                    peak["jvm"] = max(peak["jvm"], jvm.memory_info().rss / 2**20)
                except psutil.Error:
                    return
                stop.wait(0.1)

        threading.Thread(target=sample, daemon=True).start()
        notes.append(f"Connect server JVM RSS right after ready "
                     f"{jvm.memory_info().rss / 2**20:.0f} MB")
        for n in a.writers:
            out = root / f"sink-{n}w"
            start_at = time.time() + 8.0 + WARMUP_SECONDS   # after imports and warm-ups
            env = {**_env(), **bp_env}
            procs = [_run_worker(["sink", str(out), batch_processor_id("spark", i),
                                  str(start_at), "--sizes", *map(str, a.sizes)], env)
                     for i in range(n)]
            results = [_collect(p) for p in procs]
            for k, size in enumerate(a.sizes):
                per = [r["results"][k] for r in results]
                # aggregate: all rows over the longest writer's time
                seconds = max(p["seconds"] for p in per)
                agg = {"size": size, "writes": sum(p["writes"] for p in per),
                       "rows": sum(p["rows"] for p in per), "seconds": seconds,
                       "p50_ms": statistics.median(p["p50_ms"] for p in per)}
                agg["rows_per_s"] = agg["rows"] / seconds
                agg["writes_per_s"] = agg["writes"] / seconds
                rows.append((f"SparkSink, {n} writer process(es)", agg))
            notes.append(f"load average after SparkSink x{n}: {os.getloadavg()[0]:.1f}")
            notes.append(f"SparkSink writer process peak RSS ({n} writer(s)): "
                         + ", ".join(f"{r['rss_mb']:.0f} MB" for r in results))
            stop_counts = _count(bp_env, str(out), a.sizes, n)
            notes.append(f"read back ({n} writer(s)): {stop_counts}")
        stop.set()
        notes.append(f"Connect server JVM peak RSS over all SparkSink runs {peak['jvm']:.0f} MB")
        server.terminate()
        server.wait(timeout=60)

        if not a.no_classic:
            c = _collect(_run_worker(["classic", str(root / "classic"), "--sizes",
                                      *map(str, a.sizes)], stderr=root / "classic.err"))
            rows += [("classic PySpark local[2] (1 process)", r) for r in c["results"]]
            notes.append(f"load average after classic: {os.getloadavg()[0]:.1f}")
            notes.append(f"classic session start (JVM + first query) {c['start_s']:.1f} s; "
                         f"peak RSS Python {c['rss_mb']:.0f} MB, its JVM {c['jvm_rss_mb']:.0f} MB")
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)

    load1 = os.getloadavg()[0]
    print(f"\nload average 1 min: {load0:.2f} at start, {load1:.2f} at end; "
          f"{os.cpu_count()} cores\n")
    print("| writer | batch rows | writes | rows/s | writes/s | p50 write ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, r in sorted(rows, key=lambda x: (x[1]["size"], x[0])):
        print(f"| {name} | {r['size']:,} | {r['writes']} | {r['rows_per_s']:,.0f} | "
              f"{r['writes_per_s']:.1f} | {r['p50_ms']:.0f} |")
    print()
    for n in notes:
        print(f"- {n}")
    return 0


def _count(bp_env: dict[str, str], out: str, sizes: list[int], writers: int) -> str:
    """Read every dataset back through Connect: rows and distinct ids must match."""
    code = f"""
import json
from pyspark.sql.connect.client import DefaultChannelBuilder
from pyspark.sql.connect.session import SparkSession
b = DefaultChannelBuilder({bp_env['OFFBROADWAY_SPARK_REMOTE']!r})
s = SparkSession.builder.channelBuilder(b).create()
res = {{}}
for size in {sizes!r}:
    r = s.read.parquet({out!r} + f"/b{{size}}").selectExpr(
        "count(*) AS n", "count(DISTINCT message_id) AS d").collect()[0]
    res[size] = [r.n, r.d]
s.stop()
print(json.dumps(res))
"""
    env = {**_env(), "SPARK_CONNECT_AUTHENTICATE_TOKEN": bp_env["OFFBROADWAY_SPARK_TOKEN"]}
    got = json.loads(subprocess.run([sys.executable, "-c", code], env=env, check=True,
                                    capture_output=True, text=True).stdout.strip())
    parts = []
    for size in sizes:
        n, d = got[str(size)]
        expect = writers * size * (_writes_for(size) + 1)
        parts.append(f"b{size}: {n} rows, {d} distinct, expected {expect}"
                     + ("" if n == d == expect else "  <-- MISMATCH"))
    return "; ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
