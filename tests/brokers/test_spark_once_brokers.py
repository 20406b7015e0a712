"""Each message once into real Spark from a real broker, whatever is SIGKILLed.

The spool's version of these is tests/spark/test_pipeline_spark.py; here the source is
the machine's RabbitMQ, Redis (a stream read through a consumer group) or NATS JetStream
(a durable pull consumer), so what comes back after a crash is the broker's redelivery:
RabbitMQ requeues every unacked delivery of a connection that closed (same
``message_id`` property, ``redelivered`` set), Redis hands a consumer its own pending
entries again (same entry id), JetStream redelivers what a dead client held once its
``ack_wait`` is over (same ``Nats-Msg-Id``).  N messages with a unique id each; a stage,
the Spark JVM, the daemon alone or the whole process group (then a rerun) SIGKILLed
while the committer runs a Spark job; the pipeline runs until idle; the dataset must
hold every published id exactly once (counted by ``message_id``) and the broker nothing
unacked.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.brokers.conftest import AMQP_URL, REDIS_URL, unique
from tests.brokers.natsutil import NATS_URL
from tests.conftest import REPO, offbroadway_cmd, test_env, wait_until
from tests.e2e.test_pipeline import make_config, stage_pids
from tests.spark.dataset import assert_each_id_once
from tests.spark.test_pipeline_spark import (
    JVM,
    TOKEN_ENV,
    committing,
    daemon_env,
    kill_the_daemon_alone,
    kill_the_process_group,
    rows,
    run,
    sigkill_a_stage,
    spark_section,
)

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def config_for(tmp: Path, server, *, source: str, options: dict, handler: str) -> Path:
    """One batcher of two batch processors (500 rows a batch), groups of 3,000 rows into
    the suite's Spark (``server`` None: a Spark server of the daemon's own, ``local[1]``);
    processors slow enough (2 ms a message) that commits go on while the broker still has
    messages."""
    config = make_config(tmp, handler=handler, source=source, options=options,
                         context={"slow": 0.002}, shutdown_timeout=60.0, batchers={
                             "default": {"batch_size": 500, "batch_timeout": 0.5,
                                         "concurrency": 2}})
    where = {"master": "local[1]"} if server is None else \
        {"remote": server.remote, "token_env": TOKEN_ENV}
    config.write_text(config.read_text() + spark_section(
        tmp / "dataset", **where, commit_rows=3000, commit_interval=0.5))
    return config


Pipeline = tuple[Path, set[str], Callable[[], int]]


def rabbit_pipeline(tmp: Path, server, rabbit, n: int) -> Pipeline:
    """A queue with ``n`` messages (``message_id`` m<i>, JSON body) and its config; the
    callable says how many the queue still holds, ready or unacked."""
    import pika

    queue = rabbit.queue()
    for i in range(n):
        rabbit.ch.basic_publish("", queue, json.dumps({"seq": i, "route": "default"}).encode(),
                                pika.BasicProperties(message_id=f"m{i}",
                                                     content_type="application/json"))
    config = config_for(tmp, server, source="rabbitmq", handler="tests.brokers.handlers:JsonBody",
                        options={"url": AMQP_URL, "queue": queue})
    return config, {f"m{i}" for i in range(n)}, lambda: rabbit.ready(queue)


def redis_pipeline(tmp: Path, server, rq, n: int) -> Pipeline:
    """A stream with ``n`` entries and its config; the callable says how many entries the
    group has pending (delivered, not acked)."""
    stream = unique("s")
    rq.test_streams.append(stream)
    pipe = rq.pipeline(transaction=False)
    for i in range(n):
        pipe.xadd(stream, {"seq": str(i), "route": "default"})
    ids = {i.decode() if isinstance(i, bytes) else i for i in pipe.execute()}
    config = config_for(tmp, server, source="redis", handler="tests.brokers.handlers:FieldMap",
                        options={"url": REDIS_URL, "stream": stream, "group": "pipeline"})
    return config, ids, lambda: rq.xpending(stream, "pipeline")["pending"]


def nats_pipeline(tmp: Path, server, jet, n: int) -> Pipeline:
    """A stream with ``n`` messages (``Nats-Msg-Id`` m<i>) and its config; the callable
    says how many the pipeline's durable consumer has not settled (pending or unacked).
    ``ack_wait`` 5 s: what a dead producer held comes back that long after its death."""
    stream = jet.stream()
    ids = jet.publish(stream, [json.dumps({"seq": i, "route": "default"}).encode()
                               for i in range(n)])
    config = config_for(tmp, server, source="nats", handler="tests.brokers.handlers:JsonBody",
                        options={"url": NATS_URL, "stream": stream, "ack_wait": 5})

    def left() -> int:
        info = jet.consumer(stream, "e2e")    # the durable is named after the pipeline
        return info.num_pending + info.num_ack_pending

    return config, set(ids), left


#: source -> (the fixture that reaches its broker, the pipeline built on it)
PIPELINES = {"rabbitmq": ("rabbit", rabbit_pipeline), "redis": ("rq", redis_pipeline),
             "nats": ("jet", nats_pipeline)}


def pipeline(request: pytest.FixtureRequest, source: str, tmp: Path, server, n: int
             ) -> Pipeline:
    fixture, build = PIPELINES[source]
    return build(tmp, server, request.getfixturevalue(fixture), n)


def start(config: Path, tmp: Path, server, *, group: bool = False
          ) -> tuple[subprocess.Popen, Path]:
    """``run --until-idle`` with stderr in a file; ``group``: in a session of its own (so
    the test can SIGKILL the whole process group); ``server`` None: Spark is its own."""
    log = tmp / "daemon.err"
    env = test_env() if server is None else daemon_env(server)
    with open(log, "w") as err_file:
        daemon = subprocess.Popen(offbroadway_cmd("run", str(config), "--until-idle"),
                                  cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                  stderr=err_file, start_new_session=group)
    return daemon, log


def in_a_commit(tmp: Path) -> dict[str, int]:
    """Once the committer runs a Spark job (after one committed): the stages' pids (a
    daemon with a Spark server of its own starts its JVM first: minutes, here)."""
    sock = tmp / "run" / "control.sock"
    wait_until(lambda: committing(sock, "committer_default"), timeout=400, interval=0.1,
               message="the committer in a Spark job")
    return stage_pids(sock)


def kill_a_stage(tmp: Path, server, pipeline: Pipeline, stage: str) -> None:
    config, ids, left = pipeline
    daemon, log = start(config, tmp, server)
    err = sigkill_a_stage(daemon, log, lambda: in_a_commit(tmp), stage)
    assert_each_id_once(tmp, ids, err)
    assert left() == 0, "messages left unacked at the broker"


def slow(*values: object) -> object:
    return pytest.param(*values, marks=pytest.mark.slow)


# the RabbitMQ batch processor case is the default run's (~15 s, 6,000 messages); the
# others are long (pytest -m slow); the JVM's is the daemon's own Spark server's (a JVM
# start, twice)
@pytest.mark.parametrize(("source", "stage", "n"), [
    ("rabbitmq", "batch_processor_default_0", 6000),
    slow("rabbitmq", "committer_default", 12_000),
    slow("rabbitmq", "producer_0", 12_000),
    slow("redis", "batch_processor_default_0", 12_000),
    slow("redis", "committer_default", 12_000),
    slow("redis", "producer_0", 12_000),
    slow("nats", "batch_processor_default_0", 12_000),
    slow("nats", "committer_default", 12_000),
    slow("nats", "producer_0", 12_000),
    slow("rabbitmq", JVM, 12_000),
    slow("redis", JVM, 12_000),
    slow("nats", JVM, 12_000),
])
def test_sigkill_of_a_stage_during_a_commit_writes_each_once(
        request: pytest.FixtureRequest, short_tmp: Path, spark_server, source: str,
        stage: str, n: int) -> None:
    """A batch processor: the producers give back every unacked delivery (RabbitMQ's
    basic.reject requeue, JetStream's NAK) while stale copies are still in the
    processors and the batcher.  The committer: the new one reads its journal's last
    commits back.  The producer: its source takes back everything it held (RabbitMQ
    requeues the deliveries of its closed connection, Redis hands the restarted consumer
    its pending entries, JetStream redelivers after ``ack_wait``) while the stages
    downstream still hold copies whose acks go to the dead producer.  The JVM (of the
    daemon's own Spark server): the pipeline's rest_for_one restarts the server and
    everything after it (every producer: the broker takes back what they held), and the
    new committer reads its journal's last commits back from the new server.  Every id
    once."""
    server = None if stage == JVM else spark_server
    kill_a_stage(short_tmp, server, pipeline(request, source, short_tmp, server, n), stage)


@pytest.mark.slow
@pytest.mark.parametrize(("source", "kill"), [
    ("rabbitmq", "group"), ("redis", "group"), ("nats", "group"), ("rabbitmq", "daemon"),
    ("redis", "daemon"), ("nats", "daemon")])
def test_sigkill_of_the_daemon_then_a_rerun_writes_each_once(
        request: pytest.FixtureRequest, short_tmp: Path, spark_server, source: str,
        kill: str) -> None:
    """The whole process group, or the daemon process alone (its stages die of it), is
    SIGKILLed during a commit; every unacked delivery comes back to the rerun (same id):
    the rows of the journal's last commits are in doubt and are not written again."""
    config, ids, left = pipeline(request, source, short_tmp, spark_server, 12_000)
    daemon, log = start(config, short_tmp, spark_server, group=kill == "group")
    try:
        stages = in_a_commit(short_tmp).values()
        if kill == "group":
            kill_the_process_group(daemon, stages)
        else:
            kill_the_daemon_alone(daemon, stages)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert daemon.returncode == -signal.SIGKILL
    written = len(rows(short_tmp / "dataset", "default"))
    assert 0 < written < len(ids), "the kill did not land mid-run"
    proc = run(config, daemon_env(spark_server))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_each_id_once(short_tmp, ids, log.read_text() + proc.stderr)
    assert left() == 0, "messages left unacked at the broker"
