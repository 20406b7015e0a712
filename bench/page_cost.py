"""What the live page costs the pipeline: bench/throughput.py's run with its metrics
listener on, watched by the page or not, interleaved.

    .venv/bin/python bench/page_cost.py [--messages 2000000] [--repeat 5]
    .venv/bin/python bench/page_cost.py --state-cost 20

Each round runs the same pipeline twice (the order reversed every other round, so the
machine's load hits both alike): once with nobody looking, once with a viewer that does
what an open page does and more: keeps ``/api/events`` (the page's stream, a state every
second) open and also GETs ``/api/state`` and ``/metrics`` every second.  Both runs have
the listener on, so the difference is the page alone.  Prints each run's messages/s
(throughput.py's figure: from its status counters between the first acked message and
the last) and the ratio watched / unwatched per round, then the medians; and each run's
CPU per message (the stage processes and the daemon, where the page's work is done),
which moves far less than the rate with the machine's load.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
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


def state_cost(seconds: float) -> None:
    """The daemon's own CPU per state the page reads: one running pipeline (generator,
    rate-limited to 20,000 msg/s so the machine stays the same), the daemon process's CPU
    over ``seconds`` with nobody looking, then over ``seconds`` while /api/state is read
    every 0.3 s (past the page's 0.25 s sharing, so each read computes one)."""
    import shutil
    import tempfile
    from pathlib import Path

    import psutil
    from benchlib import NOOP_HANDLER, sink_and_runtime, start_daemon, status

    tmp = Path(tempfile.mkdtemp(prefix="obp-", dir="/tmp"))
    (tmp / "bench_noop.py").write_text(NOOP_HANDLER)
    port = free_port()
    config = tmp / "bench.toml"
    config.write_text("""
[pipeline]
name = "bench"
handler = "bench_noop:Noop"

[producer]
source = "generator"
rate_limit = { allowed_messages = 20000, interval = 1 }

[processors.default]
concurrency = 2
""" + sink_and_runtime(tmp, f"127.0.0.1:{port}"))
    daemon = start_daemon(tmp, config, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while status(str(tmp / "run" / "control.sock")) is None:
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit("the daemon did not come up")
            time.sleep(0.2)
        time.sleep(3)
        proc = psutil.Process(daemon.pid)

        def cpu() -> float:
            t = proc.cpu_times()
            return t.user + t.system

        c0 = cpu()
        time.sleep(seconds)
        quiet = cpu() - c0
        reads, c0, end = 0, cpu(), time.monotonic() + seconds
        while time.monotonic() < end:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/state", timeout=5) as r:
                r.read()
            reads += 1
            time.sleep(0.3)
        watched = cpu() - c0
        print(f"daemon CPU over {seconds:g} s: {quiet * 1000:.0f} ms unwatched, "
              f"{watched * 1000:.0f} ms with {reads} states read: "
              f"{(watched - quiet) / reads * 1000:.2f} ms per state, i.e. "
              f"{(watched - quiet) / reads * 100:.2f} % of a core for an open page "
              f"(one state a second)")
    finally:
        daemon.terminate()
        daemon.wait(60)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=5, help="interleaved rounds")
    ap.add_argument("--state-cost", type=float, metavar="SECONDS", default=None,
                    help="instead: the daemon's CPU per state read, over SECONDS each way")
    args = ap.parse_args()
    if args.state_cost:
        state_cost(args.state_cost)
        return
    ratios, plain, seen, cpu_ratios = [], [], [], []

    def cpu(r: dict) -> float:
        """CPU per message of the stages and the daemon together: what the machine spends
        on a message, far steadier than the wall-clock rate on a loaded machine."""
        return r["cpu_us_per_message_total"] + r["daemon_us_per_message"]

    for i in range(args.repeat):
        order = (False, True) if i % 2 == 0 else (True, False)
        got = {w: run(args.messages, w) for w in order}
        plain.append(got[False]["rate"])
        seen.append(got[True]["rate"])
        ratios.append(got[True]["rate"] / got[False]["rate"])
        cpu_ratios.append(cpu(got[True]) / cpu(got[False]))
        events, states = got[True]["viewer"]
        print(f"round {i + 1}: unwatched {got[False]['rate']:,.0f} msg/s, watched "
              f"{got[True]['rate']:,.0f} msg/s ({events} pushes, {states} states read), "
              f"ratio {ratios[-1]:.3f}; CPU per message (stages + daemon) "
              f"{cpu(got[False]):.2f} -> {cpu(got[True]):.2f} us, of which the daemon's "
              f"{got[False]['daemon_us_per_message']:.2f} -> "
              f"{got[True]['daemon_us_per_message']:.2f}: x{cpu_ratios[-1]:.3f}", flush=True)
    print(f"median: unwatched {statistics.median(plain):,.0f} msg/s, watched "
          f"{statistics.median(seen):,.0f} msg/s, ratio of medians "
          f"{statistics.median(seen) / statistics.median(plain):.3f}, median ratio "
          f"{statistics.median(ratios):.3f} over {args.repeat} rounds; CPU per message "
          f"watched / unwatched, median x{statistics.median(cpu_ratios):.3f}")


if __name__ == "__main__":
    main()
