"""Resizing a running pipeline that reads RabbitMQ or NATS JetStream: grown and shrunk
mid-stream (the sequence of :mod:`tests.e2e.test_resize`), every message handled exactly
once, the queue or durable left empty with nothing unacked, nothing requeued, no restart
counted, and each producer's prefetch window following the shape."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from offbroadway.daemon.config.load import load_config
from offbroadway.daemon.core import resize
from offbroadway.daemon.core.topology import auto_prefetch
from offbroadway.supervision.tree import snapshot_nodes

from tests.brokers.conftest import AMQP_URL
from tests.brokers.natsutil import NATS_URL
from tests.brokers.test_pipeline_brokers import rabbit_props
from tests.conftest import wait_until
from tests.e2e.handlers import read_records
from tests.e2e.test_operations import free_port
from tests.e2e.test_resize import SEQUENCE, resizable_config, resize_midstream, status

pytestmark = pytest.mark.broker


def run_resized(tmp: Path, n: int, source: str, options: dict, window: str) -> Counter:
    """The mid-stream resize sequence on a broker source holding ``n`` messages (two
    producers, prefetch "auto"): each producer's ``window`` (its source's stat) must end
    at the final shape's share, which differs from the first's; returns what handle_batch
    saw, per id."""
    port = free_port()
    config = resizable_config(tmp, port, handler="tests.brokers.handlers:JsonBody",
                              source=source, producers=2, options=options)
    out = tmp / "out"
    loaded = load_config(str(config)).config
    start, end = (auto_prefetch(resize.resized(loaded, resize.Request("processors", "default",
                                                                        k)))
                  for k in (2, SEQUENCE[-1][1]))
    assert start != end

    def window_follows(sock: str) -> None:
        def windows() -> set:
            return {nd["messages"]["source"][window] for nd in snapshot_nodes(status(sock)["tree"])
                    if nd["id"].startswith("producer_") and "messages" in nd}
        wait_until(lambda: windows() == {end}, timeout=10, message=f"{window} {end}")

    resize_midstream(tmp, config, port, n, lambda: len(read_records(str(out), "batch-")),
                     window_follows)
    assert not read_records(str(out), "failed-")
    handled = Counter(r["id"] for r in read_records(str(out), "batch-"))
    assert max(handled.values()) == 1, "a message was handled twice with nothing failing"
    return handled


def test_scale_up_and_down_midstream_rabbitmq_exact_books(short_tmp: Path, rabbit) -> None:
    n = 12_000
    queue = rabbit.queue()
    rabbit.ch.confirm_delivery()
    for i in range(n):
        rabbit.ch.basic_publish("", queue, json.dumps({"seq": i}).encode(), rabbit_props(i))
    handled = run_resized(short_tmp, n, "rabbitmq", {"url": AMQP_URL, "queue": queue},
                          "prefetch_count")
    assert set(handled) == {f"m{i}" for i in range(n)}
    assert rabbit.ready(queue) == 0
    assert rabbit.take_all(queue) == []          # nothing unacked came back either


# the RabbitMQ one runs by default: long: not in the default run (pytest -m slow)
@pytest.mark.slow
def test_scale_up_and_down_midstream_nats_exact_books(short_tmp: Path, jet) -> None:
    """The same sequence against NATS JetStream: every message once, nothing pending or
    unacked at the durable, and each producer's pull window following the shape."""
    n = 12_000
    stream = jet.stream()
    ids = jet.publish(stream, [json.dumps({"seq": i}).encode() for i in range(n)])
    handled = run_resized(short_tmp, n, "nats", {"url": NATS_URL, "stream": stream},
                          "prefetch")
    assert set(handled) == set(ids)
    info = jet.consumer(stream, "e2e")
    assert (info.num_pending, info.num_ack_pending) == (0, 0)
