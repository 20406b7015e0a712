"""``run --until-idle`` against the real RabbitMQ with a handler that fails some messages,
under each ``on_failure`` policy: the exit code, the summary and the queue the broker holds
afterwards must say the same thing, and failures that go back to the queue must neither
keep the run going for ever nor spin a core.

Messages "from an earlier run" sit in the queue before new ones are published: all of them
fail on every delivery, as do 1% of the new ones.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from offbroadway.daemon.core.outcome import EXIT_FAILED

from tests.brokers.conftest import AMQP_URL
from tests.conftest import REPO, offbroadway_cmd, test_env, wait_until
from tests.e2e.test_pipeline import make_config

pytestmark = pytest.mark.broker

NEW, OLD = 1000, 20
FAILING_NEW = {f"m{i}" for i in range(NEW) if i % 100 == 7}
FAILING = FAILING_NEW | {f"old{i}" for i in range(OLD)}


def publish(rabbit, queue: str, *, new: int = NEW, old: int = OLD) -> None:
    import pika

    rabbit.ch.confirm_delivery()
    for i in range(old):
        rabbit.ch.basic_publish("", queue, json.dumps({"seq": i, "fail": True}).encode(),
                                pika.BasicProperties(message_id=f"old{i}"))
    for i in range(new):
        body = json.dumps({"seq": i, "fail": i % 100 == 7}).encode()
        rabbit.ch.basic_publish("", queue, body, pika.BasicProperties(message_id=f"m{i}"))


def run_until_idle(config: Path, timeout: float = 150) -> subprocess.CompletedProcess:
    """The run, which must end by itself: a run still going at ``timeout`` fails the test
    (the daemon is killed, its whole session with it)."""
    started = time.monotonic()
    proc = subprocess.Popen(offbroadway_cmd("run", str(config), "--until-idle"), cwd=REPO,
                            env=test_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"--until-idle still running after {time.monotonic() - started:.0f}s: "
                    f"{out[-1500:]}\n{err[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def summary(stdout: str) -> str:
    lines = [ln for ln in stdout.splitlines() if "messages acked" in ln]
    assert len(lines) == 1, stdout
    return lines[0]


def failed_deliveries(line: str) -> int:
    m = re.search(r"(\d+) deliveries failed", line)
    return int(m.group(1)) if m else 0


@pytest.mark.parametrize("policy", ["reject_and_requeue", "reject_and_requeue_once", "reject"])
def test_until_idle_tells_the_truth_under_each_failure_policy(short_tmp: Path, rabbit,
                                                               policy: str) -> None:
    queue = rabbit.queue(dlx=True)
    publish(rabbit, queue)
    config = make_config(short_tmp, handler="tests.brokers.handlers:JsonBody", source="rabbitmq",
                         options={"url": AMQP_URL, "queue": queue, "on_failure": policy},
                         batchers={"default": {"batch_size": 100, "batch_timeout": 0.2}})
    proc = run_until_idle(config)
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]
    line = summary(proc.stdout)
    # one count per message: the 30 failing messages, however often they were delivered
    assert f"{NEW - len(FAILING_NEW)} messages acked, {len(FAILING)} failed" in line, line
    if policy == "reject_and_requeue":
        # they are back in the queue, and the last line says so with the broker's figure
        wait_until(lambda: rabbit.ready(queue) == len(FAILING), timeout=10,
                   message=f"{len(FAILING)} failing messages back in the queue")
        assert rabbit.ready(f"{queue}.dlq") == 0
        last = [ln for ln in proc.stderr.splitlines() if "--until-idle" in ln]
        assert last and f"{len(FAILING)} message(s) stay in queue {queue!r}" in last[-1], \
            proc.stderr[-3000:]
        # requeued failures are retried with a backoff: a few rounds, not thousands
        assert failed_deliveries(line) < 8 * len(FAILING), line
    else:
        assert rabbit.ready(queue) == 0
        assert sorted(rabbit.take_all(f"{queue}.dlq")) == sorted(FAILING)
    assert "every message settled" not in proc.stderr or policy != "reject_and_requeue"


def test_until_idle_ends_when_only_failing_messages_are_left(short_tmp: Path, rabbit) -> None:
    """Only messages that fail on every delivery, the default policy: the run stops, exit 3,
    and the broker holds them all; the loop did not spin (few failed deliveries)."""
    queue = rabbit.queue()
    publish(rabbit, queue, new=0, old=50)
    config = make_config(short_tmp, handler="tests.brokers.handlers:JsonBody", source="rabbitmq",
                         options={"url": AMQP_URL, "queue": queue},
                         batchers={"default": {"batch_size": 100, "batch_timeout": 0.2}})
    proc = run_until_idle(config, timeout=90)
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]
    line = summary(proc.stdout)
    assert "0 messages acked, 50 failed" in line, line
    assert failed_deliveries(line) < 8 * 50, line
    wait_until(lambda: rabbit.ready(queue) == 50, timeout=10, message="50 back in the queue")
