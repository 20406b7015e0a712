"""The whole daemon against NATS JetStream: 10,000 messages through two producers sharing
one durable consumer, nothing left pending and exactly the failed ones dead-lettered; two
daemons on one durable with no doubles; the server SIGKILLed and restarted mid-run."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from offbroadway.daemon.core.outcome import EXIT_FAILED

from tests.brokers.daemons import configs_for, handled, reap, run, side_by_side, start
from tests.brokers.daemons import failed as failed_in
from tests.brokers.natsutil import NATS_URL, Jet
from tests.conftest import wait_until
from tests.e2e.test_pipeline import make_config, stage_pids

pytestmark = pytest.mark.broker
N = 10_000


def test_nats_pipeline_acks_everything_and_dead_letters_exactly_the_failed(
        short_tmp: Path, jet: Any) -> None:
    stream = jet.stream(dead_letter=True)
    # every 100th message asks the handler to fail it
    ids = jet.publish(stream, [json.dumps({"seq": i, "fail": i % 100 == 7}).encode()
                               for i in range(N)])
    config = make_config(short_tmp, handler="tests.brokers.handlers:JsonBody", source="nats",
                         producers=2,
                         options={"url": NATS_URL, "stream": stream, "max_deliver": 2,
                                  "nak_delay": 0.1,
                                  "dead_letter_subject": f"{stream}-dead.failed"},
                         batchers={"default": {"batch_size": 200, "batch_timeout": 0.2}})
    proc = run(config)
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]   # finished, some failed
    done = handled(short_tmp)
    failed = failed_in(short_tmp)
    expected_failed = {f"m{i}" for i in range(N) if i % 100 == 7}
    assert failed == expected_failed
    assert set(done) == set(ids) - expected_failed
    assert max(done.values()) == 1
    info = jet.consumer(stream, "e2e")          # the pipeline's name is the durable's
    assert (info.num_pending, info.num_ack_pending) == (0, 0)
    dead = [m.headers["Nats-Msg-Id"] for m in jet.messages(f"{stream}-dead")]
    assert sorted(dead) == sorted(expected_failed)
    # the summary counts messages, once each: every failing message failed twice
    # (max_deliver 2: nak'ed once, then dead-lettered), and the deliveries are named apart
    summary = [line for line in proc.stdout.splitlines() if "messages acked" in line]
    assert summary == [f"e2e: {N - 100} messages acked, 100 failed; 200 deliveries failed, "
                       f"100 of them requeued for another try"], proc.stdout[-2000:]


def test_two_daemons_on_one_durable_share_the_work_without_doubles(short_tmp: Path,
                                                                   jet: Any) -> None:
    stream = jet.stream()
    n = 4000
    configs = configs_for(short_tmp, handler="tests.brokers.handlers:JsonBody", source="nats",
                          context={"slow": 0.0005}, options={"url": NATS_URL, "stream": stream},
                          batchers={"default": {"batch_size": 100, "batch_timeout": 0.2}})
    with side_by_side(configs) as side:
        ids = jet.publish(stream, [json.dumps({"seq": i}).encode() for i in range(n)])
        wait_until(lambda: sum(len(handled(t)) for t in side.dirs) >= n, timeout=120,
                   message="every message handled by one daemon or the other")
    codes = side.codes
    assert codes == [0, 0]
    a, b = (handled(t) for t in side.dirs)
    assert set(a) | set(b) == set(ids)
    assert not set(a) & set(b), "a message was handled by both daemons"
    assert max((a + b).values()) == 1
    assert len(a) > n // 10 and len(b) > n // 10, (len(a), len(b))
    info = jet.consumer(stream, "e2e")
    assert (info.num_pending, info.num_ack_pending) == (0, 0)


def test_server_killed_and_restarted_mid_run_loses_nothing(short_tmp: Path,
                                                           own_nats: Any) -> None:
    n = 6000
    setup = Jet(own_nats.url)
    try:
        stream = setup.stream()
        ids = setup.publish(stream, [json.dumps({"seq": i}).encode() for i in range(n)])
    finally:
        setup.run(setup.nc.close())
        setup.loop.close()
    config = make_config(short_tmp, handler="tests.brokers.handlers:JsonBody", source="nats",
                         context={"slow": 0.0005},
                         # what was on its way to the daemon when the server died is
                         # redelivered after ack_wait (30 s by default)
                         options={"url": own_nats.url, "stream": stream,
                                  "backoff_max": 0.5, "ack_wait": 5},
                         batchers={"default": {"batch_size": 100, "batch_timeout": 0.2}})
    daemon = start(config, "--until-idle")
    try:
        wait_until(lambda: len(handled(short_tmp)) >= 1000, timeout=120,
                   message="a first part handled")
        own_nats.kill()
        before = len(handled(short_tmp))
        time.sleep(1.0)           # the server stays down a while: the daemon must wait
        own_nats.start()
        assert daemon.wait(180) == 0, daemon.stderr.read()[-3000:] if daemon.stderr else ""
    finally:
        reap(daemon)
    done = handled(short_tmp)
    assert before < n, "the kill came after everything was handled: nothing was tested"
    assert set(done) == set(ids)
    after = Jet(own_nats.url)
    try:
        info = after.consumer(stream, "e2e")
        assert (info.num_pending, info.num_ack_pending) == (0, 0)
    finally:
        after.cleanup()
    duplicates = sum(done.values()) - len(done)
    print(f"server restart: {before} of {n} handled before the kill, {duplicates} handled "
          f"twice (acks the kill lost)")


def test_stages_sigkilled_mid_run_lose_nothing(short_tmp: Path, jet: Any) -> None:
    """A processor killed: its producer nak's what was in flight and it comes back at once.
    The producer killed: what it held is redelivered by the server after ack_wait."""
    stream = jet.stream()
    n = 5000
    ids = jet.publish(stream, [json.dumps({"seq": i}).encode() for i in range(n)])
    config = make_config(short_tmp, handler="tests.brokers.handlers:JsonBody", source="nats",
                         producers=2, context={"slow": 0.0005},
                         options={"url": NATS_URL, "stream": stream, "ack_wait": 3},
                         batchers={"default": {"batch_size": 100, "batch_timeout": 0.2}})
    control = short_tmp / "run" / "control.sock"
    daemon = start(config, "--until-idle")
    try:
        wait_until(control.exists, timeout=60, message="control socket")
        for victim, after in (("processor_default_0", 1000), ("producer_0", 2500)):
            wait_until(lambda a=after: len(handled(short_tmp)) >= a, timeout=120,
                       message=f"{after} handled before killing {victim}")
            os.kill(stage_pids(control)[victim], signal.SIGKILL)
        _, err = daemon.communicate(timeout=180)
        assert daemon.returncode == 0, err[-3000:]
    finally:
        reap(daemon)
    done = handled(short_tmp)
    assert set(done) == set(ids)
    info = jet.consumer(stream, "e2e")
    assert (info.num_pending, info.num_ack_pending) == (0, 0)
    # each message acked once at the server, and counted once: the killed producer's
    # acks since its last report too
    books = re.findall(r"producer_\d: source nats fetched \d+, acked (\d+), failed (\d+)", err)
    assert len(books) == 2 and sum(int(a) for a, _ in books) == n, (books, err[-3000:])
    print(f"nats kills: {sum(done.values()) - len(done)} handled twice (in flight at a kill)")
