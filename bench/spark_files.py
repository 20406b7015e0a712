"""What the size of a staged file costs Spark: the JVM's CPU per row to commit the same rows
staged as files of different sizes.

    .venv/bin/python bench/spark_files.py [--rows 1000000] [--file-rows 2000 10000 20000]
                                          [--commit 200000] [--rounds 3]

A batch processor stages each Broadway batch as one Parquet file, and the committer has
Spark read a group of them in one job (``SparkSink.commit_files``), so the batch size is the
staged file's size.  This bench starts the Spark Connect server exactly as the daemon does
(``bench/spark_sink.py``'s ``start_server``), builds ``--rows`` order rows (the README's
columns plus ``message_id``) once, and per round, for each ``--file-rows``, interleaved:
stages them as files of that many rows (untimed), then commits them in groups of
``--commit`` rows.  Prints, per size, the JVM's CPU µs per row over the commits (user +
system, from ``/proc`` through psutil), the commit rate, and the pyarrow write's CPU per
row; then the medians.  Three untimed rounds warm the JIT first.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spark_sink import start_server  # bench/ helper: the daemon's own Spark server

SKUS = ("apple", "plum", "kiwi", "fig", "pear", "mango", "lime", "date")


def order_table(n: int) -> pa.Table:
    rnd = random.Random(7)
    qty = [rnd.randint(1, 9) for _ in range(n)]
    price = [round(rnd.uniform(0.5, 20), 2) for _ in range(n)]
    return pa.table({
        "order": pa.array(range(n), pa.int64()),
        "sku": [rnd.choice(SKUS) for _ in range(n)],
        "qty": pa.array(qty, pa.int64()),
        "unit_price": price,
        "total": [round(q * p, 2) for q, p in zip(qty, price)],
        "message_id": [f"orders-{i // 100_000}.jsonl:{i % 100_000}" for i in range(n)]})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--file-rows", type=int, nargs="+", default=[2000, 10000, 20000])
    ap.add_argument("--commit", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="spark-files-"))
    proc, committer_env, jvm_pid, ready = start_server(root)
    os.environ.update(committer_env)
    from offbroadway.stages.spark.spark_sink import SparkSink

    print(f"Spark Connect server ready in {ready:.1f} s; load {os.getloadavg()[0]:.1f}",
          flush=True)
    table = order_table(args.rows)
    jvm = psutil.Process(jvm_pid)
    sink = SparkSink(output=str(root / "out"), writer_id="bench", staging=str(root / "stg"))

    def jvm_cpu() -> float:
        t = jvm.cpu_times()
        return t.user + t.system

    def run(name: str, file_rows: int) -> tuple[float, float, float]:
        folder = root / "stg" / name
        folder.mkdir(parents=True)
        files: list[tuple[str, int]] = []
        c = time.process_time()
        for start in range(0, args.rows, file_rows):
            path = folder / f"{start}.parquet"
            pq.write_table(table.slice(start, file_rows), path)
            files.append((f"file://{path}", min(file_rows, args.rows - start)))
        stage_us = (time.process_time() - c) / args.rows * 1e6
        per_group = max(1, args.commit // file_rows)
        c, t = jvm_cpu(), time.perf_counter()
        for g in range(0, len(files), per_group):
            group = files[g:g + per_group]
            sink.commit_files(name, [f for f, _ in group], table.schema,
                              sum(n for _, n in group))
        jvm_us = (jvm_cpu() - c) / args.rows * 1e6
        return jvm_us, args.rows / (time.perf_counter() - t), stage_us

    try:
        for w in range(3):
            run(f"warm{w}", args.file_rows[0])
        got: dict[int, list[tuple[float, float, float]]] = {n: [] for n in args.file_rows}
        for r in range(args.rounds):
            for n in args.file_rows:
                jvm_us, rate, stage_us = run(f"r{r}-{n}", n)
                got[n].append((jvm_us, rate, stage_us))
                print(f"round {r + 1}: files of {n:>6,} rows: jvm {jvm_us:5.2f} us/row, "
                      f"{rate:9,.0f} rows/s, staging {stage_us:4.2f} us/row "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)
        print(f"\n| staged file | jvm us/row (median) | commit rows/s | staging us/row |")
        print("| ---: | ---: | ---: | ---: |")
        for n, v in got.items():
            print(f"| {n:,} rows | {statistics.median(x[0] for x in v):.2f} | "
                  f"{statistics.median(x[1] for x in v):,.0f} | "
                  f"{statistics.median(x[2] for x in v):.2f} |")
    finally:
        sink.close()
        proc.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
