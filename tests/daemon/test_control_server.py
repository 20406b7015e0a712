"""The control socket's server on its own loop, with real sockets and real client
processes: what a flood gets, and what it cannot grow."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from offbroadway.daemon.cli import control
from offbroadway.daemon.shell import control_server

#: a client asking ``status`` back to back for SECONDS, printing how many it got
CLIENT = """
import sys, time
from offbroadway.daemon.cli import control
path, seconds = sys.argv[1], float(sys.argv[2])
sys.stdin.readline()                  # all clients start together
t0, n = time.monotonic(), 0
while time.monotonic() - t0 < seconds:
    assert control.request(path, {"cmd": "status"}, timeout=10)["ok"]
    n += 1
print(n)
"""


class Served:
    """A control server on a loop in a thread; its handler counts the computed answers."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.computed = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            control_server.serve(path, self.handle), self.loop).result(10)

    async def handle(self, request: dict) -> dict:
        self.computed += 1
        return {"ok": True, "echo": request}

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def served(short_tmp: Path) -> Iterator[Served]:
    s = Served(str(short_tmp / "c.sock"))
    yield s
    s.close()


def test_two_clients_flooding_get_the_accept_rate_and_no_more(served: Served) -> None:
    """Past the burst, connections are taken in ticks of ACCEPT_TICK: two clients asking
    back to back share ACCEPT_RATE a second between them, neither more (the limit) nor
    much less (the ticks take what queued meanwhile, not one connection a tick)."""
    seconds = 3.0
    clients = [subprocess.Popen([sys.executable, "-c", CLIENT, served.path, str(seconds)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
               for _ in range(2)]
    for c in clients:
        assert c.stdin is not None
        c.stdin.write("go\n")
        c.stdin.flush()
    counts = [int(c.communicate(timeout=60)[0]) for c in clients]
    rate = (sum(counts) - control_server.ACCEPT_BURST) / seconds
    assert rate <= control_server.ACCEPT_RATE * 1.1, counts
    assert rate >= control_server.ACCEPT_RATE * 0.8, counts
    assert min(counts) >= 0.3 * sum(counts), counts       # neither is starved


def test_answers_kept_for_varied_requests_stay_bounded(served: Served) -> None:
    """``status`` answers are shared by identical requests; a client that varies its
    request each time gets its own answer computed, and the kept answers stay at most
    KEPT_MOST however many kinds it sends."""
    most = control_server.KEPT_MOST
    for i in range(3 * most):
        reply = control.request(served.path, {"cmd": "status", "n": i}, timeout=10)
        assert reply["echo"]["n"] == i
    assert served.computed == 3 * most
    answers = served.server._answers
    assert 0 < len(answers._kept) <= most
    # the same request again, at once: shared, not computed again
    computed = served.computed
    request = {"cmd": "status", "n": 3 * most - 1}
    assert control.request(served.path, request, timeout=10)["echo"] == request
    assert served.computed == computed
    assert json.dumps(request, sort_keys=True) in answers._kept

