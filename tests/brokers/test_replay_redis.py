"""Dead letters of Redis Streams, seen and replayed: the source copies failures to
``<stream>:dead``; once the handler is fixed ``offbroadway dead-letters replay`` moves them
back to the stream; every order is written exactly once, and a second replay finds
nothing to do."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from offbroadway.daemon.core.outcome import EXIT_FAILED

from tests.brokers.conftest import REDIS_URL, unique
from tests.brokers.daemons import run
from tests.e2e.replay_handlers import written
from tests.e2e.test_pipeline import make_config
from tests.e2e.test_replay_spool import dead_letters

pytestmark = pytest.mark.broker

N = 200
NO_SKU = set(range(7, N, 10))


def test_failed_entries_replayed_from_the_dead_letter_stream_once(short_tmp: Path, rq) -> None:
    stream = unique("s")
    rq.test_streams.append(stream)
    pipe = rq.pipeline(transaction=False)
    for i in range(N):
        pipe.xadd(stream, {"seq": str(i), **({} if i in NO_SKU else {"sku": f"s{i}"})})
    pipe.execute()
    config = make_config(short_tmp, source="redis", handler="tests.e2e.replay_handlers:Picky",
                         options={"url": REDIS_URL, "stream": stream, "group": "pipeline"},
                         batchers={"default": {"batch_size": 20, "batch_timeout": 0.2}})
    out = str(short_tmp / "out")
    first = run(config)
    assert first.returncode == EXIT_FAILED, first.stderr[-3000:]   # the run says some failed
    assert Counter(written(out)) == Counter(set(range(N)) - NO_SKU)
    assert rq.xlen(f"{stream}:dead") == len(NO_SKU)

    listed = dead_letters(config)
    assert listed.returncode == 0, listed.stderr
    assert f"{len(NO_SKU)} dead letters in stream '{stream}:dead'" in listed.stdout, listed.stdout
    assert f"{len(NO_SKU):>7}  no sku" in listed.stdout, listed.stdout
    shown = dead_letters(config, "show", "--limit", "1")
    assert f"stream {stream} entry " in shown.stdout and '"seq": "7"' in shown.stdout, \
        shown.stdout

    config.write_text(config.read_text().replace("context = {", "context = { fixed = true,"))
    replayed = dead_letters(config, "replay", "--reason", "no sku")
    assert replayed.returncode == 0, replayed.stderr
    assert f"replayed {len(NO_SKU)} to stream '{stream}'" in replayed.stdout, replayed.stdout
    assert rq.xlen(f"{stream}:dead") == 0
    second = run(config)
    assert second.returncode == 0, second.stderr[-3000:]
    assert Counter(written(out)) == Counter(range(N)), "every order written exactly once"

    again = dead_letters(config, "replay")
    assert again.stdout.startswith(f"nothing to replay: no dead letters in stream "
                                   f"'{stream}:dead'"), again.stdout
    third = run(config)
    assert third.returncode == 0, third.stderr[-3000:]
    assert Counter(written(out)) == Counter(range(N))
    assert rq.xpending(stream, "pipeline")["pending"] == 0
