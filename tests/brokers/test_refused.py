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
    # said by the daemon, before anything starts (Source.refused), in open()'s words
    assert f"ERROR [daemon] offbroadway.sources: {source} source: cannot " in said[0]
    assert "nope" not in proc.stderr          # a password is never shown


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_refused_source_is_said_before_the_jvm_starts(short_tmp: Path, rq: Any,
                                                        case: str) -> None:
    """With ``[spark]`` (a local server: half a minute of JVM before the producers open):
    rc 1 and one line, in under 5 s, and no Spark server was started."""
    import time

    source, options, words = CASES[case]
    if options.get("stream") == "<string key>":
        options = {**options, "stream": unique("str")}
        rq.set(options["stream"], "not a stream")
        rq.test_streams.append(options["stream"])
    config = make_config(short_tmp, source=source, options=options,
                         batchers={"spark": {"batch_size": 10}})
    config.write_text(config.read_text() + f'\n[spark]\noutput = "{short_tmp / "out"}"\n'
                      'master = "local[1]"\n')
    started = time.monotonic()
    proc = run(config)
    took = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert took < 5.0, (took, proc.stderr[-3000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], proc.stderr[-3000:]
    assert f"ERROR [daemon] offbroadway.sources: {source} source: cannot " in lines[0]
    assert "nope" not in proc.stderr
    assert not (short_tmp / "state" / "spark").exists()     # no Spark server was started


def test_an_unreachable_broker_is_not_a_refusal() -> None:
    """Nobody listening is what the source retries with backoff: the check lets the
    daemon start as before (and says nothing)."""
    from offbroadway.stages.sources.rabbitmq import parse_options
    from offbroadway.stages.sources.rabbitmq.refusal import refusal

    assert refusal(parse_options({"url": "amqp://guest:guest@127.0.0.1:1/%2F",
                                  "queue": "any"})) is None
    assert refusal(parse_options({"url": AMQP_URL, "queue": unique("missing")})) is not None
