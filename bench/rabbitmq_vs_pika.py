"""RabbitMQ → Python: offbroadway against the plain pika loop a user would write instead.

    .venv/bin/python bench/rabbitmq_vs_pika.py [--messages 200000] [--rounds 2]
        [--processors 2] [--metrics/--no-metrics]

Both contenders drain a queue of ``--messages`` small JSON messages (about 60 bytes:
``{"id": n, "sku": "sku-…", "qty": …, "price": …}``) from the local broker
(127.0.0.1:5672, guest/guest), each from its own freshly filled queue (unique names,
deleted afterwards); rounds alternate which goes first, so the machine's load falls on both
alike:

* **pika**: one ``BlockingConnection``, ``basic_qos(prefetch_count=1000)``, a
  ``basic_consume`` callback that does ``json.loads`` and acks every 100th delivery with
  ``multiple=True``: what a user writes when they do not use a framework.
* **offbroadway**: the daemon, ``rabbitmq`` source (1 producer, ``prefetch_count`` auto),
  processors (``--processors``, default 2) whose ``handle_message`` does the same
  ``json.loads`` and routes to a batcher of 100, whose batch processor's ``handle_batch``
  returns the batch (the sink); no Spark; ``/metrics`` on a free port unless
  ``--no-metrics`` (a service's default).  Run ``--until-idle``.

The rate is messages over the time from the first message to the last: for pika, the
first and last callback; for the daemon, its status counters (polled every 0.1 s) from
the first acked message to the last, so process start-up is not counted for either.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import pika
from benchlib import (
    free_port,
    producer_acked,
    producer_source,
    sample_cpu,
    sink_and_runtime,
    start_daemon,
    statuses,
)

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"

HANDLER = '''
import json
from offbroadway import Pipeline

class JsonLoads(Pipeline):
    def handle_message(self, processor, message, context):
        message.data = json.loads(message.data)
        return message.put_batcher("sink")

    def handle_batch(self, batcher, messages, batch_info, context):
        return messages
'''


def body(i: int) -> bytes:
    return json.dumps({"id": i, "sku": f"sku-{i % 977}", "qty": i % 7 + 1,
                       "price": round(i % 1000 * 0.37, 2)}).encode()


def fill(queue: str, n: int) -> None:
    """Declare ``queue`` and publish ``n`` messages; returns once the broker counts them."""
    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    ch = conn.channel()
    ch.queue_declare(queue, durable=False)
    publish = ch.basic_publish
    for i in range(n):
        publish("", queue, body(i))
    deadline = time.monotonic() + 60
    while ch.queue_declare(queue, passive=True).method.message_count < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"the broker never counted {n} messages in {queue}")
        time.sleep(0.05)
    conn.close()


def delete(queue: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    conn.channel().queue_delete(queue)
    conn.close()


def pika_loop(queue: str, n: int) -> dict:
    """The plain loop.  Returns the rate between the first and the last delivery."""
    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1000)
    state = {"n": 0, "first": 0.0, "last": 0.0}
    loads = json.loads

    def on_message(ch, method, props, payload):
        loads(payload)
        state["n"] += 1
        if state["n"] == 1:
            state["first"] = time.perf_counter()
        if state["n"] % 100 == 0 or state["n"] == n:
            ch.basic_ack(method.delivery_tag, multiple=True)
        if state["n"] == n:
            state["last"] = time.perf_counter()
            ch.stop_consuming()

    ch.basic_consume(queue, on_message)
    cpu0 = time.process_time()
    ch.start_consuming()
    cpu = time.process_time() - cpu0
    conn.close()
    seconds = state["last"] - state["first"]
    return {"messages": state["n"], "seconds": seconds, "rate": (state["n"] - 1) / seconds,
            "cpu_us": cpu / state["n"] * 1e6}


def source_loop(queue: str, n: int, prefetch: int) -> dict:
    """offbroadway's ``rabbitmq`` source alone, in this process, driven the way a producer
    drives it (poll its fd, fetch up to 1000, ack in lists of 100), with the same
    ``json.loads``: what the source costs by itself, without the pipeline."""
    import select

    from offbroadway.stages.sources.rabbitmq import RabbitMQSource

    src = RabbitMQSource({"url": AMQP_URL, "queue": queue, "prefetch_count": prefetch},
                         pipeline="bench", producer_index=0, producer_count=1)
    src.open()
    loads = json.loads
    got = 0
    first = last = 0.0
    cpu0 = time.process_time()
    try:
        poller = select.poll()
        poller.register(src.fileno(), select.POLLIN)
        while got < n:
            items = src.fetch(1000)
            if not items:
                poller.poll(200)
                continue
            if not got:
                first = time.perf_counter()
            for i in range(0, len(items), 100):
                chunk = items[i:i + 100]
                for item in chunk:
                    loads(item[1])
                src.ack([item[3] for item in chunk])
            got += len(items)
        last = time.perf_counter()
    finally:
        src.close()
    cpu = time.process_time() - cpu0
    return {"messages": got, "seconds": last - first, "rate": (got - 1) / (last - first),
            "cpu_us": cpu / got * 1e6}




def daemon_run(queue: str, n: int, processors: int, metrics: bool) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="obr-", dir="/tmp"))
    (tmp / "bench_rmq.py").write_text(HANDLER)
    listen = f"127.0.0.1:{free_port()}" if metrics else ""
    config = tmp / "bench.toml"
    config.write_text(f"""
[pipeline]
name = "rmqbench"
handler = "bench_rmq:JsonLoads"

[producer]
source = "rabbitmq"

[producer.options]
url = "{AMQP_URL}"
queue = "{queue}"

[processors.default]
concurrency = {processors}

""" + sink_and_runtime(tmp, listen))
    daemon = start_daemon(tmp, config, "--until-idle")
    sock = str(tmp / "run" / "control.sock")
    first: tuple[float, int] | None = None
    last: tuple[float, int] = (0.0, 0)
    source: dict = {}
    cpu: dict[int, tuple[str, float, float, float]] = {}
    for status in statuses(daemon, sock, 0.1):
        acked = producer_acked(status["tree"])
        source = producer_source(status["tree"]) or source
        sample_cpu(status["tree"], cpu)
        now = time.perf_counter()
        if acked and first is None:
            first = (now, acked)
        if acked > last[1]:
            last = (now, acked)
    out, err = daemon.communicate()
    shutil.rmtree(tmp, ignore_errors=True)
    if daemon.returncode != 0 or first is None:
        raise SystemExit(f"daemon failed ({daemon.returncode}):\n{err[-3000:]}")
    if f"{n} messages acked" not in out:
        raise SystemExit(f"the daemon did not ack all {n}: {out.strip()}\n{err[-2000:]}")
    seconds = last[0] - first[0]
    return {"messages": last[1], "seconds": seconds, "rate": (last[1] - first[1]) / seconds,
            "ack_frames": source.get("ack_frames"), "prefetch": source.get("prefetch_count"),
            "cpu_us": sum(c[1] for c in cpu.values()) / last[1] * 1e6,
            "cpu_us_by_role": _by_role(cpu, last[1])}


def _by_role(cpu: dict[int, tuple[str, float, float, float]], n: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for role, total, _io, _system in cpu.values():
        out[role] = out.get(role, 0.0) + total
    return {k: round(v / n * 1e6, 1) for k, v in out.items()}








def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--processors", type=int, default=2)
    ap.add_argument("--no-metrics", action="store_true")
    ap.add_argument("--only", choices=("pika", "offbroadway", "source"),
                    help="run one contender (for profiling); 'source' is the rabbitmq "
                         "source alone in this process")
    ap.add_argument("--source", action="store_true",
                    help="also run the rabbitmq source alone in each round")
    args = ap.parse_args()
    print(f"load: {os.getloadavg()}; {os.cpu_count()} cores", flush=True)
    tag = uuid.uuid4().hex[:8]
    rates: dict[str, list[float]] = {"pika": [], "offbroadway": [], "source": []}
    for r in range(args.rounds):
        order = ["pika", "offbroadway"] if r % 2 == 0 else ["offbroadway", "pika"]
        if args.source:
            order.insert(1, "source")
        if args.only:
            order = [args.only]
        for who in order:
            queue = f"obbench-{tag}-{r}-{who}"
            fill(queue, args.messages)
            try:
                if who == "pika":
                    res = pika_loop(queue, args.messages)
                elif who == "source":
                    res = source_loop(queue, args.messages, 1000)
                else:
                    res = daemon_run(queue, args.messages, args.processors,
                                     not args.no_metrics)
            finally:
                delete(queue)
            rates[who].append(res["rate"])
            extra = (f"; ack frames {res['ack_frames']}, prefetch {res['prefetch']}, CPU "
                     f"µs/msg by role {res['cpu_us_by_role']}" if who == "offbroadway"
                     else "")
            print(f"round {r + 1} {who:<12} {res['rate']:9.0f} msgs/s "
                  f"({res['messages']} in {res['seconds']:.2f} s), CPU {res['cpu_us']:.1f} "
                  f"µs/msg, load {os.getloadavg()[0]:.2f}{extra}", flush=True)
        if "pika" in order and "offbroadway" in order:
            print(f"round {r + 1} ratio offbroadway/pika "
                  f"{rates['offbroadway'][-1] / rates['pika'][-1]:.2f}", flush=True)
    if rates["pika"] and rates["offbroadway"]:
        a, b = statistics.median(rates["offbroadway"]), statistics.median(rates["pika"])
        print(f"median: offbroadway {a:.0f} msgs/s, pika {b:.0f} msgs/s, ratio {a / b:.2f}")
    if rates["pika"] and rates["source"]:
        a, b = statistics.median(rates["source"]), statistics.median(rates["pika"])
        print(f"median: source alone {a:.0f} msgs/s, ratio to pika {a / b:.2f}")
    print(f"load: {os.getloadavg()}")


if __name__ == "__main__":
    main()
