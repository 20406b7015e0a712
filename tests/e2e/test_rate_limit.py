"""The pipeline's rate limit ([producer] rate_limit, offbroadway rate-limit): one budget
for all producers, measured from when the processors handled each message; a live change
takes effect within one interval; status and metrics show the limit and the throttling."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from offbroadway.stages.flow import ratelimit
from offbroadway.supervision.tree import snapshot_find

from tests.conftest import REPO, offbroadway_cmd, start_daemon, test_env, wait_until
from tests.e2e.rate_handlers import stamps
from tests.e2e.test_operations import free_port
from tests.e2e.test_pipeline import make_config


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(offbroadway_cmd(*args), cwd=REPO, env=test_env(),
                          capture_output=True, text=True, timeout=30)


def rate(out: Path, start: float, seconds: float) -> float:
    """Messages handled per second in [start, start + seconds), once it is all written."""
    end = start + seconds
    wait_until(lambda: time.time() > end + 0.5 and max(stamps(str(out))) > end, timeout=seconds
               + 30, interval=0.1, message=f"messages handled after {end}")
    return sum(start <= t < end for t in stamps(str(out))) / seconds


def test_pure_bucket_arithmetic() -> None:
    b = ratelimit.set_limit(ratelimit.Bucket(), 100, 1.0, 1_500_000_000)
    granted, b = ratelimit.take(b, 60, 1_600_000_000)
    assert (granted, b.remaining, b.throttled) == (60, 40, 0)
    granted, b = ratelimit.take(b, 60, 1_700_000_000)
    assert (granted, b.remaining, b.throttled) == (40, 0, 1)
    b = ratelimit.give_back(b, 10, b.window_start)
    assert b.remaining == 10
    b = ratelimit.give_back(b, 10, 0)            # a window that is over: nothing comes back
    assert b.remaining == 10
    granted, b = ratelimit.take(b, 60, 2_000_000_000)     # the next window refills
    assert (granted, b.remaining) == (60, 40)
    assert ratelimit.parse("500/1") == (500, 1.0) and ratelimit.parse("off") is None
    for bad in ("500", "x/1", "0/1", "5/0", "5/-1"):
        with pytest.raises(ValueError):
            ratelimit.parse(bad)


# long: not in the default run (pytest -m slow)
@pytest.mark.slow
def test_rate_limit_holds_changes_live_and_is_shown(short_tmp: Path) -> None:
    config = make_config(short_tmp, handler="tests.e2e.rate_handlers:Stamped",
                         source="generator", producers=2, options={"payload_bytes": 10})
    port = free_port()
    text = config.read_text().replace(
        "[producer.options]",
        "rate_limit = { allowed_messages = 250, interval = 0.5 }\n\n[producer.options]")
    config.write_text(text.replace('listen = ""', f'listen = "127.0.0.1:{port}"'))
    assert cli("check", str(config)).returncode == 0
    sock = str(short_tmp / "run" / "control.sock")
    out = short_tmp / "out"
    daemon = start_daemon(config)
    try:
        wait_until(lambda: len(stamps(str(out))) > 500, timeout=60, message="messages flow")
        # 250 per 0.5 s: 500 messages a second, whatever the two producers could do
        measured = rate(out, time.time(), 10.0)
        assert abs(measured - 500) <= 50, f"{measured:.0f} msg/s under a 500 msg/s limit"
        print(f"rate limit 500/s: {measured:.1f} msg/s over 10 s")

        status = json.loads(cli("status", "--json", "--socket", sock).stdout)
        assert status["rate_limit"]["allowed_messages"] == 250
        assert status["rate_limit"]["throttled"] > 0
        supervisor = snapshot_find(status["tree"], "ProducerSupervisor")
        assert supervisor is not None, status["tree"]
        assert all(p["messages"]["in"] > 0 for p in supervisor["children"]), \
            "one producer took the whole budget"
        scrape = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        assert b'offbroadway_rate_limit_allowed_messages{pipeline="e2e"} 250.0' in scrape
        assert b"offbroadway_rate_limit_throttled_total" in scrape
        shown = cli("rate-limit", "--socket", sock)
        assert "250 messages per 0.5s" in shown.stdout, shown

        bad = cli("rate-limit", "5/x", "--socket", sock)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad
        assert "Traceback" not in bad.stderr

        # a live change: in force from one interval after the command returned
        changed = cli("rate-limit", "100/0.5", "--socket", sock)
        assert changed.returncode == 0 and "100 messages per 0.5s" in changed.stdout, changed
        measured = rate(out, time.time() + 0.5, 5.0)
        assert abs(measured - 200) <= 20, f"{measured:.0f} msg/s after the change to 200"
        print(f"changed to 200/s: {measured:.1f} msg/s over 5 s from one interval later")

        off = cli("rate-limit", "off", "--socket", sock)
        assert off.returncode == 0 and "off" in off.stdout, off
        measured = rate(out, time.time() + 0.5, 2.0)
        assert measured > 400, f"{measured:.0f} msg/s with the limit off"
        print(f"limit off: {measured:.1f} msg/s")
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()
