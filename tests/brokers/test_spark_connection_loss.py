"""A RabbitMQ connection lost mid-run, with real Spark: each message written once, and
the summary counts each message once.

When the source's connection drops, the broker takes back every delivery it held
unacknowledged and delivers them again (``redelivered`` set), while the stale copies of
those messages live on in the stages downstream, and are written.  The producer lives on,
so no restart tells the committer: the source says so (``taken_back``), the daemon tells
the committers, and they watch for the copies (docs/design-spark.md §5).  Before, a run of
200,000 messages whose connection dropped wrote 7,261 rows twice, and its summary said
212,739 messages acked (the stale copies' acks, which the source drops, counted too).

The connection goes through a TCP proxy the test takes down once, while a commit runs
and the source holds thousands of deliveries unacknowledged.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.brokers.conftest import AMQP_URL, TcpProxy
from tests.brokers.test_spark_once_brokers import config_for, in_a_commit
from tests.conftest import REPO, offbroadway_cmd, wait_until
from tests.spark.dataset import assert_each_id_once
from tests.spark.test_pipeline_spark import daemon_env, stage_stats, status

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def _unacked_at_source(sock: Path) -> int:
    producer = stage_stats(status(sock)).get("producer_0", {})
    return int((producer.get("source") or {}).get("unacked") or 0)


def test_a_lost_connection_writes_each_message_once_and_counts_it_once(
        short_tmp: Path, spark_server, rabbit) -> None:
    import pika

    n = 8000
    queue = rabbit.queue()
    for i in range(n):
        rabbit.ch.basic_publish("", queue, json.dumps({"seq": i, "route": "default"}).encode(),
                                pika.BasicProperties(message_id=f"m{i}",
                                                     content_type="application/json"))
    proxy = TcpProxy(5672)
    url = AMQP_URL.replace(":5672/", f":{proxy.port}/")
    config = config_for(short_tmp, spark_server, source="rabbitmq",
                        handler="tests.brokers.handlers:JsonBody",
                        options={"url": url, "queue": queue, "backoff_min": 0.2})
    sock = short_tmp / "run" / "control.sock"
    out, err = short_tmp / "daemon.out", short_tmp / "daemon.err"
    with open(out, "w") as fout, open(err, "w") as ferr:
        daemon = subprocess.Popen(offbroadway_cmd("run", str(config), "--until-idle"),
                                  cwd=REPO, env=daemon_env(spark_server), stdout=fout,
                                  stderr=ferr)
    try:
        in_a_commit(short_tmp)
        wait_until(lambda: _unacked_at_source(sock) >= 1000, timeout=60, interval=0.05,
                   message="the source holding deliveries unacknowledged")
        held = _unacked_at_source(sock)
        proxy.down()
        proxy.up()
        daemon.wait(timeout=240)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        proxy.down()
    log = err.read_text()
    assert daemon.returncode == 0, log[-3000:]
    assert "connection to" in log and "lost" in log, "the connection did not drop"
    assert re.search(r"the sources deliver again what was in flight \(producer_0: "
                     r"connection lost", log), log[-3000:]
    assert_each_id_once(short_tmp, {f"m{i}" for i in range(n)}, log)
    assert rabbit.ready(queue) == 0, "messages left at the broker"
    summary = [ln for ln in out.read_text().splitlines() if "messages acked" in ln]
    assert summary == [f"e2e: {n} messages acked, 0 failed"], (held, summary, log[-3000:])
