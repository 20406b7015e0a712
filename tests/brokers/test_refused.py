"""A broker that refuses the source as configured (credentials, a missing queue or stream,
a key that is not a stream) ends ``offbroadway run`` with one line in the server's words
and a non-zero exit, never a Python traceback: the real daemon against the real RabbitMQ,
Redis and NATS of this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.brokers.conftest import AMQP_URL, REDIS_URL, unique
from tests.brokers.daemons import run
from tests.brokers.natsutil import NATS_URL
from tests.e2e.test_pipeline import make_config

pytestmark = pytest.mark.broker

CASES = {
    "rabbitmq-credentials": ("rabbitmq", {"url": AMQP_URL.replace("guest:guest", "guest:nope"),
                                          "queue": "obtest-any"}, "ACCESS_REFUSED"),
    "rabbitmq-no-queue": ("rabbitmq", {"url": AMQP_URL, "queue": unique("missing")},
                          "NOT_FOUND - no queue"),
    # (a password for the default user is ignored by redis-py on a server without one)
    "redis-credentials": ("redis", {"url": REDIS_URL.replace("redis://",
                                                             "redis://nobody:nope@"),
                                    "stream": unique("s")}, "invalid username-password"),
    "redis-not-a-stream": ("redis", {"url": REDIS_URL, "stream": "<string key>"}, "WRONGTYPE"),
    "nats-no-stream": ("nats", {"url": NATS_URL, "stream": unique("missing").replace("-", "_")},
                       "does not exist"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_source_is_one_line_and_a_failed_exit(short_tmp: Path, rq: Any,
                                                      case: str) -> None:
    source, options, words = CASES[case]
    if options.get("stream") == "<string key>":
        options = {**options, "stream": unique("str")}
        rq.set(options["stream"], "not a stream")
        rq.test_streams.append(options["stream"])
    proc = run(make_config(short_tmp, handler="tests.e2e.handlers:NoBatch", source=source,
                           options=options))
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    said = [ln for ln in proc.stderr.splitlines() if words in ln]
    assert len(said) == 1, proc.stderr[-3000:]
    assert f"ERROR [producer_0] offbroadway.sources: {source} source: cannot " in said[0]
    assert "nope" not in proc.stderr          # a password is never shown
