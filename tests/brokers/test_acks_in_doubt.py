"""A producer SIGKILLed while an ack frame is leaving, on the real RabbitMQ: the books
must say what the broker did with that frame.

The window is real but narrow (between the frame's write and the count of it; the I/O
thread waits there for the GIL), so the test holds a producer in it: every process of
the daemon starts with a ``sitecustomize`` (on its ``PYTHONPATH``) that wraps pika's
``BlockingChannel.basic_ack``.  Armed by a file naming a frame number, the first producer
to send that many ``multiple`` ack frames has its last one held for a minute, either just
after its write (the broker got it) or just before (it never left), and the test SIGKILLs
that producer there.  Counting frames, not waiting for a count in ``status``, holds one
early in the run however fast the machine drains the queue.  Nothing of the
daemon's own code is changed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.brokers.test_counts_agree import status
from tests.brokers.test_failure_books_producers import config_for, publish
from tests.brokers.test_until_idle_failures import summary
from tests.conftest import REPO, env_with_site, free_port, offbroadway_cmd, test_env, wait_until
from tests.e2e.test_pipeline import run_until_idle_while

pytestmark = pytest.mark.broker

HOLD = textwrap.dedent("""
    import os, time

    _dir = os.environ.get("OB_TEST_HOLD_ACK")
    if _dir:
        from pika.adapters.blocking_connection import BlockingChannel

        _real = BlockingChannel.basic_ack
        _frames = [0]

        def _take(mode):
            path = os.path.join(_dir, mode)
            try:
                with open(path) as f:
                    if _frames[0] < int(f.read()):
                        return False
                os.rename(path, os.path.join(_dir, f"held.{os.getpid()}"))
                return True
            except (OSError, ValueError):
                return False

        def basic_ack(self, delivery_tag=0, multiple=False):
            if multiple:
                _frames[0] += 1
            if multiple and _take("before"):
                time.sleep(60)
            _real(self, delivery_tag, multiple)
            if multiple and _take("after"):
                time.sleep(60)

        BlockingChannel.basic_ack = basic_ack
""")


@pytest.mark.parametrize("mode", ["after", "before"])
def test_a_producer_killed_with_an_ack_frame_on_its_way_is_counted_as_the_broker_did(
        short_tmp: Path, rabbit, mode: str) -> None:
    n = 6000
    queue = rabbit.queue()
    publish(rabbit, queue, [{"flaky": False}] * n)
    hold = short_tmp / "hold"
    hold.mkdir()
    env = env_with_site(short_tmp, HOLD, OB_TEST_HOLD_ACK=str(hold))
    # /metrics on: the acks that land go into the dead incarnation's archived counter
    config = config_for(short_tmp, queue, "reject_and_requeue", prefetch=50,
                        metrics=free_port())
    (hold / mode).write_text("6")    # a producer's sixth frame: a few hundred acked before

    def kill_the_held_producer() -> None:
        held = wait_until(lambda: next(hold.glob("held.*"), None), timeout=30,
                          interval=0.01, message=f"a producer held {mode} an ack frame")
        assert rabbit.ready(queue) > 100, "the run was nearly over before the kill"
        os.kill(int(held.name.split(".")[1]), signal.SIGKILL)
        if mode == "after":
            # the daemon read the frame from the tally: in doubt until the run ends
            doubt = wait_until(lambda: status(config).get("acks_in_doubt", 0), timeout=30,
                               interval=0.05, message="acks in doubt in status")
            page = subprocess.run(offbroadway_cmd("status", "--config", str(config)),
                                  cwd=REPO, env=test_env(), capture_output=True, text=True,
                                  timeout=60).stdout
            assert f"(+{doubt} in doubt)" in page, page

    code, out, err = run_until_idle_while(config, kill_the_held_producer, env=env,
                                          timeout=150)
    assert "killed by SIGKILL" in err and "killed while an ack frame of" in err, err[-3000:]
    line = summary(out)
    assert code == 0, (line, err[-4000:])
    assert line.startswith(f"e2e: {n} messages acked, 0 failed"), (line, err[-3000:])
    assert rabbit.ready(queue) == 0
    landed = "ack(s) in doubt never came back" in err
    # after the write the broker got the frame: its messages never came back; before, it
    # never left: every one came back, was acked again and counted once, then
    assert landed == (mode == "after"), err[-3000:]
    assert "have no counter to go to" not in err, err[-3000:]
