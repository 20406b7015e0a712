"""Back-pressure with a pull source (issue 12 item 5): nothing but demand bounds the spool.

RabbitMQ's prefetch bounds a stalled pipeline by itself (``test_backpressure.py``); the
spool would hand out every line it has, so here only the demand windows and the stages'
buffers can stop the producer.  The batch sink stalls after its first ``OPEN_FOR`` messages
(a point the pipeline fixes: a quiet machine moves the whole spool between two status
reports, so a stall the test started on seeing acks came after the end) and stays stalled
for at least ``STALL`` seconds; the producer's fetched count must stop at or below
``bound(...)`` beyond what was acked, stay there, and the tree's memory must stay flat;
then everything drains and nothing is lost.

The bound, derived from the stages (in events; P processors, n batch processors):

* producer: it fetches only ``dispatcher.demand - len(buffer)``, and its dispatcher's
  demand is what the processors asked and were not yet sent, so its buffer is part of the
  processors' units (producer.py ``pump``);
* each processor: its budget never holds more than ``max_demand`` units across the
  producers (asked, in transit, in its inbox), and it asks again only while its output
  for the batchers is below ``out_limit`` (processor.py ``can_ask``); the last ask
  happens with at most ``out_limit - 1`` handled messages waiting, so it holds at most
  ``out_limit - 1 + max_demand``;
* the batcher: it asks each processor for up to ``upstream_demand`` events and asks again
  only while at most ``max(1, n)`` batches wait for the batch processors (batcher.py
  ``can_ask``), so it holds at most ``max(1, n)`` full batches, a partial one and
  ``P x upstream_demand`` events asked for;
* each batch processor: ``batch_demand`` batches (config.py ``batch_demand``), one of them
  stalled in ``handle_batch``.

So in flight (fetched, not yet acked) <= P x (out_limit + max_demand)
+ (max(1, n) + 1) x batch_size + P x upstream_demand + n x batch_demand x batch_size.
Every figure is read at run time: ``out_limit`` from the processors' status, the rest from
the config as the daemon loads it, so a change of defaults changes the bound, not the test.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path

from tests.conftest import start_daemon, wait_until
from tests.e2e.daemon_status import producer_books, tree_nodes, tree_rss
from tests.e2e.handlers import read_records

N = 30_000
PAYLOAD = 1000
STALL = 10.0
#: messages the sink takes before it stalls: the acks of at most one wake-up's batches (a
#: batch processor reads up to ``BatchProcessorStage.UPSTREAM_BURST`` = 10 frames a wake-up
#: and acks at its end) are held behind the stalled batch, so at least OPEN_FOR - 900 are
#: acked when the stall begins
OPEN_FOR = 2000
#: RSS may move this much while nothing moves (allocator noise, metrics, logs)
RSS_FLAT = 16 * 2**20


def write_spool(spool: Path, n: int, files: int = 3) -> None:
    spool.mkdir(parents=True)
    pad = "p" * PAYLOAD
    per = n // files
    for f in range(files):
        lines = (json.dumps({"seq": i, "pad": pad}) for i in range(f * per, (f + 1) * per))
        (spool / f"part-{f:03d}.jsonl").write_text("\n".join(lines) + "\n")


def config_text(tmp: Path) -> str:
    return f"""
[pipeline]
name = "bp-spool"
handler = "tests.e2e.backpressure_handlers:GatedRecorder"
shutdown_timeout = 30
context = {{ out = "{tmp / 'out'}", gate = "{tmp / 'gate'}", open_for = {OPEN_FOR} }}

[producer]
source = "spool"

[producer.options]
path = "{tmp / 'spool'}"

[processors.default]
concurrency = 2
max_demand = 100

[batchers.default]
batch_size = 100
batch_timeout = 0.2

[metrics]
listen = ""

[runtime]
dir = "{tmp / 'run'}"
state_dir = "{tmp / 'state'}"
"""


def bound(config_path: Path, out_limits: list[int]) -> int:
    """The docstring's bound, from the loaded config and the processors' ``out_limit``."""
    from offbroadway.daemon.config.load import load_config
    from offbroadway.daemon.config.records import batch_demand

    loaded = load_config(str(config_path))
    config = getattr(loaded, "config", loaded)
    proc = config.processors["default"]
    b = config.batchers["default"]
    assert len(out_limits) == proc.concurrency
    return (sum(out_limits) + proc.concurrency * proc.max_demand
            + (max(1, b.concurrency) + 1) * b.batch_size
            + proc.concurrency * b.upstream_demand
            + b.concurrency * batch_demand(b) * b.batch_size)


def test_a_stalled_sink_bounds_what_a_pull_source_hands_out(short_tmp: Path) -> None:
    write_spool(short_tmp / "spool", N)
    (short_tmp / "out").mkdir()
    config = short_tmp / "pipeline.toml"
    config.write_text(config_text(short_tmp))
    gate = short_tmp / "gate"
    gate.touch()                              # the sink stalls after OPEN_FOR messages
    sock = short_tmp / "run" / "control.sock"
    daemon = start_daemon(config, "--until-idle")
    try:
        wait_until(lambda: sock.exists() and producer_books(sock).get("acked", 0) >= 500,
                   timeout=60, interval=0.1, message="the first messages acked")
        rss0 = tree_rss(daemon.pid)           # flowed, maybe not yet filled behind the stall
        seen: list[dict] = []

        def filled_up() -> bool:
            seen.append(producer_books(sock))
            return len(seen) >= 4 and seen[-4]["fetched"] == seen[-1]["fetched"]

        wait_until(filled_up, timeout=60, interval=0.5,
                   message="the pipeline full and the producer no longer fetching")
        limit = bound(config, [n["messages"]["out_limit"] for n in tree_nodes(sock).values()
                               if n["id"].startswith("processor_")])
        base = seen[-1]
        samples = []
        end = time.monotonic() + STALL        # an observation window, not a wait
        while time.monotonic() < end:
            p = producer_books(sock)
            samples.append((p["fetched"], p["acked"], p["inflight"], tree_rss(daemon.pid)))
            time.sleep(0.25)
        gate.unlink()                         # the sink answers again
        code = daemon.wait(120)
    finally:
        if gate.exists():
            gate.unlink()
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(60)
    stderr = daemon.stderr.read()
    assert code == 0, stderr[-3000:]
    assert len(samples) >= 10
    fetched = {s[0] for s in samples}
    assert fetched == {base["fetched"]}, f"the producer fetched while stalled: {fetched}"
    assert base["fetched"] < N, "the whole spool was fetched: nothing bounded it"
    held = max(s[0] - s[1] for s in samples)
    assert held <= limit, f"{held} fetched and not acked, above the bound {limit}"
    assert max(s[2] for s in samples) <= limit
    rss = [s[3] for s in samples]
    assert max(rss) - rss[0] < RSS_FLAT, (
        f"tree RSS grew by {(max(rss) - rss[0]) / 2**20:.1f} MiB during the stall")
    print(f"stalled {STALL:.0f} s: fetched {base['fetched']} of {N}, held {held} "
          f"(bound {limit}), tree RSS {rss0 / 2**20:.0f} MiB before the stall, "
          f"{rss[0] / 2**20:.0f}..{max(rss) / 2**20:.0f} MiB during it")
    # after the stall: everything handled once, the spool settled
    handled = Counter(r["id"] for r in read_records(str(short_tmp / "out"), "batch-"))
    assert len(handled) == N and max(handled.values()) == 1
    assert not read_records(str(short_tmp / "out"), "failed-")
    assert not list((short_tmp / "spool").glob("*.jsonl"))
