"""What the live page costs the pipeline: bench/throughput.py's run with its metrics
listener on, watched by the page or not, interleaved.

    .venv/bin/python bench/page_cost.py [--messages 2000000] [--repeat 5]

Each round runs the same pipeline twice (the order reversed every other round, so the
machine's load hits both alike): once with nobody looking, once with a viewer that does
what an open page does and more: keeps ``/api/events`` (the page's stream, a state every
second) open and also GETs ``/api/state`` and ``/metrics`` every second.  Both runs have
the listener on, so the difference is the page alone.  Prints each run's messages/s
(throughput.py's figure: from its status counters between the first acked message and
the last) and the ratio watched / unwatched per round, then the medians.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import urllib.request

from benchlib import free_port
from throughput import daemon_run


class Viewer:
    """A page's traffic against ``port`` until stopped: the event stream, plus a state and
    a scrape each second (what it fetched is counted, so a viewer that saw nothing fails
    the bench instead of flattering it)."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.stop = threading.Event()
        self.events = self.states = 0
        self.threads = [threading.Thread(target=self._stream, daemon=True),
                        threading.Thread(target=self._poll, daemon=True)]
        for t in self.threads:
            t.start()

    def _stream(self) -> None:
        while not self.stop.is_set():
            try:
                with urllib.request.urlopen(self.base + "/api/events", timeout=5) as r:
                    for line in r:
                        if line.startswith(b"data: "):
                            self.events += 1
                        if self.stop.is_set():
                            return
            except OSError:
                time.sleep(0.1)      # not listening yet, or gone: the run starts or ends

    def _poll(self) -> None:
        while not self.stop.wait(1.0):
            for path in ("/api/state", "/metrics"):
                try:
                    with urllib.request.urlopen(self.base + path, timeout=5) as r:
                        r.read()
                    self.states += path == "/api/state"
                except OSError:
                    pass

    def close(self) -> None:
        self.stop.set()


def run(messages: int, watched: bool) -> dict:
    port = free_port()
    viewer = Viewer(port) if watched else None
    try:
        r = daemon_run(messages, 16, "spread", listen=f"127.0.0.1:{port}")
    finally:
        if viewer is not None:
            viewer.close()
    if viewer is not None:
        if not viewer.events or not viewer.states:
            raise SystemExit(f"the viewer saw nothing (events {viewer.events}, states "
                             f"{viewer.states}): the page was not served")
        r["viewer"] = (viewer.events, viewer.states)
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=5, help="interleaved rounds")
    args = ap.parse_args()
    ratios, plain, seen = [], [], []
    for i in range(args.repeat):
        order = (False, True) if i % 2 == 0 else (True, False)
        got = {w: run(args.messages, w) for w in order}
        plain.append(got[False]["rate"])
        seen.append(got[True]["rate"])
        ratios.append(got[True]["rate"] / got[False]["rate"])
        events, states = got[True]["viewer"]
        print(f"round {i + 1}: unwatched {got[False]['rate']:,.0f} msg/s, watched "
              f"{got[True]['rate']:,.0f} msg/s ({events} pushes, {states} states read), "
              f"ratio {ratios[-1]:.3f}", flush=True)
    print(f"median: unwatched {statistics.median(plain):,.0f} msg/s, watched "
          f"{statistics.median(seen):,.0f} msg/s, ratio of medians "
          f"{statistics.median(seen) / statistics.median(plain):.3f}, median ratio "
          f"{statistics.median(ratios):.3f} over {args.repeat} rounds")


if __name__ == "__main__":
    main()
