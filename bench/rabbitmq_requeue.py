"""How fast RabbitMQ takes a consumer's whole window back: one ``basic.nack`` (multiple,
requeue) against one ``basic.reject`` (requeue) a delivery, as the RabbitMQ source once did.

    .venv/bin/python bench/rabbitmq_requeue.py [--messages 65000] [--reject-seconds 20]

A fresh queue of ``--messages`` messages, all delivered to one consumer (``prefetch_count``
= the count), the consumer cancelled, then the window handed back.  ``nack``: one frame;
the time until the broker says every message is ready again.  ``reject``: one frame a
delivery for at most ``--reject-seconds``; how many are ready again by then.  Needs the
machine's RabbitMQ (``AMQP_URL``, default guest on 127.0.0.1); no yardstick is involved.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid

import pika

URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


def window(ch: pika.adapters.blocking_connection.BlockingChannel, n: int) -> tuple[str, list[int]]:
    queue = f"requeue-bench-{uuid.uuid4().hex[:8]}"
    ch.queue_declare(queue)
    for i in range(n):
        ch.basic_publish("", queue, str(i).encode())
    ch.basic_qos(prefetch_count=n)
    tags: list[int] = []
    tag = ch.basic_consume(queue, lambda _c, m, _p, _b: tags.append(m.delivery_tag))
    deadline = time.monotonic() + 120
    while len(tags) < n and time.monotonic() < deadline:
        ch.connection.process_data_events(time_limit=0.1)
    ch.basic_cancel(tag)
    return queue, tags


def ready(ch: pika.adapters.blocking_connection.BlockingChannel, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def run(mode: str, n: int, limit: float) -> str:
    conn = pika.BlockingConnection(pika.URLParameters(URL))
    ch, probe = conn.channel(), conn.channel()
    queue, tags = window(ch, n)
    t0 = time.monotonic()
    if mode == "nack":
        ch.basic_nack(tags[-1], multiple=True, requeue=True)
    else:
        for t in tags:
            ch.basic_reject(t, requeue=True)
            if time.monotonic() - t0 > limit:
                break
    while ready(probe, queue) < n and time.monotonic() - t0 < limit:
        time.sleep(0.01)
    took, back = time.monotonic() - t0, ready(probe, queue)
    probe.queue_delete(queue)
    conn.close()
    return f"{mode:6} {len(tags):,} delivered: {back:,} ready again after {took:.2f} s"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=65_000)
    ap.add_argument("--reject-seconds", type=float, default=20.0)
    args = ap.parse_args()
    print(f"load {os.getloadavg()[0]:.1f}")
    print(run("nack", args.messages, 120.0))
    print(run("reject", args.messages, args.reject_seconds))


if __name__ == "__main__":
    main()
