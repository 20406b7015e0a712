"""The README's pipeline end to end into Spark, beside Spark alone and pyarrow alone.

    .venv/bin/python bench/spark_e2e.py [--lines 1000000] [--rounds 2] [--no-rabbitmq]
                                        [--max-demand N] [--keep]

One Spark Connect server (started exactly as the daemon starts its own: argv and env from
``offbroadway.daemon.spark.plan``) serves every Spark run, so all of them pay the same
JVM.  The rows are ``--lines`` order lines like ``examples/spool``
(``{"order", "sku", "qty", "unit_price"}``), priced by ``examples/orders.py``.

Per round, interleaved:

* **pipeline, spool**: ``config/example.toml`` as shipped, run with ``--until-idle`` in a
  directory of its own holding ``var/spool`` (so the config's own relative spool path is
  used), with two changes: the metrics port (a free one) and ``[spark] remote`` +
  ``token_env`` pointing at the shared server instead of starting a second JVM.  Timed
  from the daemon's "pipeline … is up" log line (the producer fetches from then on) to the
  modification time of the last Parquet file published (the last commit); rows counted
  in the dataset.
* **Spark alone**: the same rows, already priced, as 100k-row Arrow tables (plus
  ``message_id`` and ``ingested_at``) → ``createDataFrame`` → ``write.parquet(append)``
  through one Connect session, one after the other.  Timed: the writes only.
* **pyarrow alone**: the same tables → ``pq.write_table``, one file each.
* **pipeline, RabbitMQ** (once, after the rounds): the same config with the RabbitMQ
  source (``prefetch_count = "auto"``) on a queue preloaded with the same lines.

``--max-demand N`` also runs the spool pipeline with ``[processors.default] max_demand =
N`` (min_demand N/2): the sink's own ceiling when the data plane is not the bound.
Prints each run, medians and the ratios to Spark alone.
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import free_port  # bench/ helpers
from spark_sink import _env, start_server

REPO = Path(__file__).resolve().parent.parent
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
TOKEN_ENV = "OB_BENCH_SPARK_TOKEN"
BATCH = 100_000
UP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*pipeline \S+ is up", re.M)
SKUS = ("apple", "plum", "kiwi", "fig", "pear", "mango", "lime", "date")


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
                   max_demand: int | None = None) -> str:
    text = (REPO / "config" / "example.toml").read_text()
    text = text.replace('listen = "127.0.0.1:9464"', f'listen = "127.0.0.1:{free_port()}"')
    text = text.replace("[spark]\n", f"[spark]\nremote = {json.dumps(remote)}\n"
                                     f"token_env = {json.dumps(TOKEN_ENV)}\n")
    if rabbit_queue is not None:
        # a delivery's data is its body (bytes): the same handler, the JSON decoded first
        text = text.replace('handler = "examples.orders:Orders"',
                            'handler = "bench_orders:RabbitOrders"')
        text = text.replace('source = "spool"', 'source = "rabbitmq"')
        text = text.replace('path = "var/spool"',
                            f'url = "{AMQP_URL}"\nqueue = "{rabbit_queue}"\n'
                            f'prefetch_count = "auto"')
    if max_demand is not None:
        text = re.sub(r"max_demand = \d+\nmin_demand = \d+",
                      f"max_demand = {max_demand}\nmin_demand = {max_demand // 2}", text)
    return text


RABBIT_HANDLER = """
import json

from examples.orders import Orders


class RabbitOrders(Orders):
    def handle_message(self, processor, message, context):
        if isinstance(message.data, bytes):
            message = message.update_data(json.loads)
        return super().handle_message(processor, message, context)
"""


def run_pipeline(workdir: Path, config_text: str, token: str) -> dict[str, Any]:
    import pyarrow.parquet as pq

    config = workdir / "bench.toml"
    config.write_text(config_text)
    (workdir / "bench_orders.py").write_text(RABBIT_HANDLER)
    env = {**_env(), TOKEN_ENV: token, "PYTHONPATH": f"{REPO}:{workdir}"}
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "offbroadway.daemon.cli", "run", str(config),
                           "--until-idle"], cwd=workdir, env=env, capture_output=True,
                          text=True, timeout=3600)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"pipeline failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    up = UP.search(proc.stderr)
    assert up, proc.stderr[-2000:]
    start = datetime.strptime(up[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    dataset = workdir / "var" / "orders" / "spark"
    files = [p for p in dataset.rglob("*.parquet") if "_staging" not in p.parts]
    if not files:
        raise SystemExit(f"no rows written:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    last = max(p.stat().st_mtime for p in files)
    rows = pq.read_table(dataset).num_rows
    wrote = re.search(r"wrote (\d+) rows", proc.stdout)
    return {"rows": rows, "seconds": last - start, "rate": rows / (last - start),
            "wall": wall, "files": len(files), "printed": wrote[0] if wrote else "",
            "load": os.getloadavg()[0]}


def priced_tables(lines: list[str]) -> list[Any]:
    """The rows the pipeline writes, as 100k-row Arrow tables (built untimed)."""
    import pyarrow as pa

    now = datetime.now(UTC)
    tables = []
    for b in range(0, len(lines), BATCH):
        rows = [json.loads(x) for x in lines[b:b + BATCH]]
        for r in rows:
            r["total"] = round(r["qty"] * r.get("unit_price", 0.0), 2)
        cols = {k: pa.array([r[k] for r in rows]) for k in rows[0]}
        cols["message_id"] = pa.array([f"orders-{b + i}" for i in range(len(rows))])
        cols["ingested_at"] = pa.repeat(pa.scalar(now, pa.timestamp("us", tz="UTC")),
                                        len(rows))
        tables.append(pa.table(cols))
    return tables


def spark_alone(session: Any, tables: list[Any], out: Path) -> dict[str, Any]:
    took = 0.0
    for t in tables:
        t0 = time.perf_counter()
        session.createDataFrame(t).write.mode("append").parquet(str(out))
        took += time.perf_counter() - t0
    rows = sum(t.num_rows for t in tables)
    return {"rows": rows, "seconds": took, "rate": rows / took, "load": os.getloadavg()[0]}


def pyarrow_alone(tables: list[Any], out: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for i, t in enumerate(tables):
        pq.write_table(t, out / f"part-{i:05d}.parquet")
    took = time.perf_counter() - t0
    rows = sum(t.num_rows for t in tables)
    return {"rows": rows, "seconds": took, "rate": rows / took, "load": os.getloadavg()[0]}


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-rabbitmq", action="store_true")
    ap.add_argument("--max-demand", type=int, default=None)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="spark-e2e-"))
    print(f"load before: {os.getloadavg()}; dir {tmp}", flush=True)
    lines = order_lines(args.lines)
    (tmp / "server").mkdir()
    server, bp_env, _jvm, ready = start_server(tmp / "server")
    remote, token = bp_env["OFFBROADWAY_SPARK_REMOTE"], bp_env["OFFBROADWAY_SPARK_TOKEN"]
    print(f"Spark Connect server ready in {ready:.1f} s", flush=True)
    from pyspark.sql.connect.client import DefaultChannelBuilder
    from pyspark.sql.connect.session import SparkSession

    builder = DefaultChannelBuilder(remote)
    builder.set("token", token)
    session = SparkSession.builder.channelBuilder(builder).create()
    tables = priced_tables(lines)
    session.createDataFrame(tables[0].slice(0, 1000)).write.mode("overwrite") \
        .parquet(str(tmp / "warm"))   # the JIT warm-up no run should pay alone
    results: dict[str, list[dict[str, Any]]] = {}

    def record(name: str, r: dict[str, Any]) -> None:
        results.setdefault(name, []).append(r)
        extra = f" ({r['printed']}; {r['files']} files; wall {r['wall']:.1f} s)" \
            if "printed" in r else ""
        print(f"{name}: {r['rows']} rows in {r['seconds']:.1f} s = {r['rate']:,.0f} rows/s, "
              f"load {r['load']:.1f}{extra}", flush=True)

    try:
        for rnd in range(args.rounds):
            record("Spark alone (100k-row Arrow batches)",
                   spark_alone(session, tables, tmp / f"alone-{rnd}"))
            record("pyarrow alone (100k-row tables)", pyarrow_alone(tables, tmp / f"pa-{rnd}"))
            work = tmp / f"spool-{rnd}"
            write_spool(work / "var" / "spool", lines)
            record("pipeline, spool, config/example.toml",
                   run_pipeline(work, example_config(remote), token))
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
            if args.max_demand:
                work = tmp / f"spool-md-{rnd}"
                write_spool(work / "var" / "spool", lines)
                record(f"pipeline, spool, max_demand {args.max_demand}",
                       run_pipeline(work, example_config(remote, max_demand=args.max_demand),
                                    token))
                if not args.keep:
                    shutil.rmtree(work, ignore_errors=True)
        if not args.no_rabbitmq:
            queue = f"spark-e2e-{os.getpid()}"
            t0 = time.monotonic()
            preload(queue, lines)
            print(f"published {len(lines)} lines in {time.monotonic() - t0:.1f} s", flush=True)
            try:
                work = tmp / "rabbit"
                work.mkdir()
                record("pipeline, RabbitMQ, config/example.toml",
                       run_pipeline(work, example_config(remote, rabbit_queue=queue), token))
            finally:
                delete_queue(queue)
    finally:
        session.stop()
        server.terminate()
        server.wait(60)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    alone = statistics.median(r["rate"] for r in results["Spark alone (100k-row Arrow batches)"])
    print("\n| run | rounds | median rows/s | ratio to Spark alone |\n| --- | ---: | ---: | ---: |")
    for name, rs in results.items():
        med = statistics.median(r["rate"] for r in rs)
        print(f"| {name} | {len(rs)} | {med:,.0f} | {med / alone:.2f} |")
    print(f"\nload after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
