"""Dead letters of NATS JetStream, seen and replayed: the source publishes a message that
failed ``max_deliver`` times to ``dead_letter_subject``; once the handler is fixed
``offbroadway dead-letters replay`` publishes them back to their subject and deletes them
from the dead-letter stream; every order is written exactly once, and a second replay
finds nothing to do."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from offbroadway.daemon.core.outcome import EXIT_FAILED

from tests.brokers.daemons import run
from tests.brokers.natsutil import NATS_URL
from tests.e2e.replay_handlers import written
from tests.e2e.test_pipeline import make_config
from tests.e2e.test_replay_spool import dead_letters

# slow: replay is in the default run with RabbitMQ, Redis and the spool
pytestmark = [pytest.mark.broker, pytest.mark.slow]

N = 100
NO_SKU = set(range(1, N, 10))


def test_failed_messages_replayed_from_the_dead_letter_subject_once(short_tmp: Path,
                                                                      jet: Any) -> None:
    stream = jet.stream(dead_letter=True)
    jet.publish(stream, [json.dumps({"seq": i, **({} if i in NO_SKU else {"sku": "x"})})
                         .encode() for i in range(N)])
    dead = f"{stream}-dead"
    config = make_config(short_tmp, source="nats", handler="tests.e2e.replay_handlers:Picky",
                         options={"url": NATS_URL, "stream": stream, "max_deliver": 1,
                                  "dead_letter_subject": f"{dead}.failed"},
                         batchers={"default": {"batch_size": 20, "batch_timeout": 0.2}})
    out = str(short_tmp / "out")
    first = run(config)
    assert first.returncode == EXIT_FAILED, first.stderr[-3000:]   # the run says some failed
    assert Counter(written(out)) == Counter(set(range(N)) - NO_SKU)
    assert len(jet.messages(dead)) == len(NO_SKU)

    listed = dead_letters(config)
    assert listed.returncode == 0, listed.stderr
    assert f"{len(NO_SKU)} dead letters in subject '{dead}.failed' (stream {dead})" \
        in listed.stdout, listed.stdout
    assert f"{len(NO_SKU):>7}  no sku" in listed.stdout, listed.stdout

    config.write_text(config.read_text().replace("context = {", "context = { fixed = true,"))
    replayed = dead_letters(config, "replay")
    assert replayed.returncode == 0, replayed.stderr
    assert f"replayed {len(NO_SKU)} to subject '{stream}.in'" in replayed.stdout, \
        replayed.stdout
    assert jet.messages(dead) == []
    second = run(config)
    assert second.returncode == 0, second.stderr[-3000:]
    assert Counter(written(out)) == Counter(range(N)), "every order written exactly once"

    again = dead_letters(config, "replay")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"nothing to replay: no dead letters in subject "
                                   f"'{dead}.failed'"), again.stdout
    third = run(config)
    assert third.returncode == 0, third.stderr[-3000:]
    assert Counter(written(out)) == Counter(range(N))
