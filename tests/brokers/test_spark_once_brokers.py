"""Each message once into real Spark from a real broker, whatever is SIGKILLed.

The spool's version of these is tests/spark/test_pipeline_spark.py; here the source is
the machine's RabbitMQ or Redis (a stream read through a consumer group), so what comes
back after a crash is the broker's redelivery: RabbitMQ requeues every unacked delivery
of a connection that closed (same ``message_id`` property, ``redelivered`` set), Redis
hands a consumer its own pending entries again (same entry id).  N messages with a unique
id each; a stage (or the whole process group, then a rerun) SIGKILLed while the
committer runs a Spark job; the pipeline runs until idle; the dataset must hold every
published id exactly once (counted by ``message_id``) and the broker nothing unacked.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.brokers.conftest import AMQP_URL, REDIS_URL, unique
from tests.conftest import REPO, offbroadway_cmd, wait_until
from tests.e2e.test_pipeline import make_config, stage_pids
from tests.spark.test_pipeline_spark import (
    TOKEN_ENV,
    committing,
    daemon_env,
    kill_the_process_group,
    rows,
    run,
    sigkill_a_stage,
    spark_section,
)

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def config_for(tmp: Path, server, *, source: str, options: dict, handler: str) -> Path:
    """One batcher of two batch processors (500 rows a batch), groups of 3,000 rows into
    the suite's Spark; processors slow enough (2 ms a message) that commits go on while
    the broker still has messages."""
    config = make_config(tmp, handler=handler, source=source, options=options,
                         context={"slow": 0.002}, shutdown_timeout=30.0, batchers={
                             "default": {"batch_size": 500, "batch_timeout": 0.5,
                                         "concurrency": 2}})
    config.write_text(config.read_text() + spark_section(
        tmp / "dataset", remote=server.remote, token_env=TOKEN_ENV, commit_rows=3000,
        commit_interval=0.5))
    return config


def rabbit_pipeline(tmp: Path, server, rabbit, n: int) -> tuple[Path, set[str], Callable]:
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


def redis_pipeline(tmp: Path, server, rq, n: int) -> tuple[Path, set[str], Callable]:
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


def start(config: Path, tmp: Path, server, *, group: bool = False) -> tuple[subprocess.Popen, Path]:
    """``run --until-idle`` with stderr in a file; ``group``: in a session of its own (so
    the test can SIGKILL the whole process group)."""
    log = tmp / "daemon.err"
    with open(log, "w") as err_file:
        daemon = subprocess.Popen(offbroadway_cmd("run", str(config), "--until-idle"),
                                  cwd=REPO, env=daemon_env(server), stdout=subprocess.DEVNULL,
                                  stderr=err_file, start_new_session=group)
    return daemon, log


def in_a_commit(tmp: Path) -> dict[str, int]:
    """Once the committer runs a Spark job (after one committed): the stages' pids."""
    sock = tmp / "run" / "control.sock"
    wait_until(lambda: committing(sock, "committer_default"), timeout=120, interval=0.1,
               message="the committer in a Spark job")
    return stage_pids(sock)


def assert_each_id_once(tmp: Path, ids: set[str], log: str) -> None:
    """Every published id in the dataset, once: counted by ``message_id``."""
    found = Counter(r["message_id"] for r in rows(tmp / "dataset", "default"))
    lost = ids - set(found)
    twice = {k: v for k, v in found.items() if v > 1}
    stray = set(found) - ids
    assert not (lost or twice or stray), (
        f"{len(lost)} lost (e.g. {sorted(lost)[:5]}), {len(twice)} written more than once "
        f"({sum(twice.values()) - len(twice)} duplicate rows, e.g. {sorted(twice)[:5]}), "
        f"{len(stray)} not published\n{log[-5000:]}")


def kill_a_stage(tmp: Path, server, pipeline: tuple[Path, set[str], Callable],
                 stage: str) -> None:
    config, ids, left = pipeline
    daemon, log = start(config, tmp, server)
    err = sigkill_a_stage(daemon, log, lambda: in_a_commit(tmp), stage)
    assert_each_id_once(tmp, ids, err)
    assert left() == 0, "messages left unacked at the broker"


def kill_the_group_then_rerun(tmp: Path, server, pipeline: tuple[Path, set[str], Callable]
                              ) -> None:
    config, ids, left = pipeline
    daemon, log = start(config, tmp, server, group=True)
    try:
        kill_the_process_group(daemon, in_a_commit(tmp).values())
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert daemon.returncode == -signal.SIGKILL
    written = len(rows(tmp / "dataset", "default"))
    assert 0 < written < len(ids), "the kill did not land mid-run"
    proc = run(config, daemon_env(server))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_each_id_once(tmp, ids, log.read_text() + proc.stderr)
    assert left() == 0, "messages left unacked at the broker"


# -- RabbitMQ ----------------------------------------------------------------------------

def test_rabbitmq_sigkill_of_a_batch_processor_during_a_commit_writes_each_once(
        short_tmp: Path, spark_server, rabbit) -> None:
    """The producers give back every unacked delivery (basic.reject requeue) while stale
    copies are still in the processors and the batcher: every id once."""
    kill_a_stage(short_tmp, spark_server, rabbit_pipeline(short_tmp, spark_server, rabbit, 6000),
                 "batch_processor_default_0")


@pytest.mark.slow
def test_rabbitmq_sigkill_of_the_committer_during_a_commit_writes_each_once(
        short_tmp: Path, spark_server, rabbit) -> None:
    kill_a_stage(short_tmp, spark_server,
                 rabbit_pipeline(short_tmp, spark_server, rabbit, 12_000), "committer_default")


@pytest.mark.slow
def test_rabbitmq_sigkill_of_the_producer_during_a_commit_writes_each_once(
        short_tmp: Path, spark_server, rabbit) -> None:
    """The producer's connection closes with it: RabbitMQ requeues every delivery it held,
    while the stages downstream still hold copies (their acks go to a dead producer)."""
    kill_a_stage(short_tmp, spark_server,
                 rabbit_pipeline(short_tmp, spark_server, rabbit, 12_000), "producer_0")


@pytest.mark.slow
def test_rabbitmq_sigkill_of_the_whole_process_group_then_a_rerun_writes_each_once(
        short_tmp: Path, spark_server, rabbit) -> None:
    """Every unacked delivery comes back to the rerun (same message_id, redelivered): the
    rows of the journal's last commits are in doubt and are not written again."""
    kill_the_group_then_rerun(short_tmp, spark_server,
                              rabbit_pipeline(short_tmp, spark_server, rabbit, 12_000))


# -- Redis Streams -----------------------------------------------------------------------

@pytest.mark.slow
def test_redis_sigkill_of_a_batch_processor_during_a_commit_writes_each_once(
        short_tmp: Path, spark_server, rq) -> None:
    kill_a_stage(short_tmp, spark_server, redis_pipeline(short_tmp, spark_server, rq, 12_000),
                 "batch_processor_default_0")


@pytest.mark.slow
def test_redis_sigkill_of_the_committer_during_a_commit_writes_each_once(
        short_tmp: Path, spark_server, rq) -> None:
    kill_a_stage(short_tmp, spark_server, redis_pipeline(short_tmp, spark_server, rq, 12_000),
                 "committer_default")


@pytest.mark.slow
def test_redis_sigkill_of_the_producer_during_a_commit_writes_each_once(
        short_tmp: Path, spark_server, rq) -> None:
    """The restarted producer (same consumer name) reads its pending entries again while
    the stages downstream still hold copies of them."""
    kill_a_stage(short_tmp, spark_server, redis_pipeline(short_tmp, spark_server, rq, 12_000),
                 "producer_0")


@pytest.mark.slow
def test_redis_sigkill_of_the_whole_process_group_then_a_rerun_writes_each_once(
        short_tmp: Path, spark_server, rq) -> None:
    kill_the_group_then_rerun(short_tmp, spark_server,
                              redis_pipeline(short_tmp, spark_server, rq, 12_000))
