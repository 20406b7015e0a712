"""A live pipeline under hostile frames: random bytes, truncated and wrong-shaped msgpack,
extra message parts, sent to the stages' own sockets while messages flow.  Every stage
stays up, counts what it dropped, and every message is still handled exactly once."""

from __future__ import annotations

import json
import random
import signal
from collections import Counter
from pathlib import Path

import msgpack
import zmq
from offbroadway.stages.wire import protocol
from offbroadway.stages.wire.events import encode_rows
from offbroadway.supervision.tree import snapshot_nodes

from tests.conftest import start_daemon, wait_until
from tests.e2e.handlers import read_records
from tests.e2e.test_operations import cli
from tests.e2e.test_pipeline import make_config, write_spool


def hostile_frames(rng: random.Random, n: int) -> list[list[bytes]]:
    valid = protocol.events(encode_rows([(0, 1, "x", {}, {})]))
    out = []
    for i in range(n):
        choice = i % 5
        if choice == 0:
            parts = [rng.randbytes(rng.randint(0, 64))]
        elif choice == 1:
            parts = [valid[: rng.randint(0, len(valid) - 1)]]
        elif choice == 2:
            parts = [msgpack.packb([protocol.VERSION, rng.randint(-5, 50), "?", [1, {}]])]
        elif choice == 3:
            parts = [msgpack.packb([protocol.VERSION, protocol.ACK, "not a list", None])]
        else:
            parts = [b"a", b"b", b"c"]          # more parts than any of ours
        out.append(parts)
    return out


def test_stages_survive_and_count_hostile_frames(short_tmp: Path) -> None:
    n = 3000
    write_spool(short_tmp / "spool", n, files=2)
    config = make_config(short_tmp, context={"slow": 0.0005}, batchers={
        "even": {"batch_size": 100, "batch_timeout": 0.3},
        "odd": {"batch_size": 100, "batch_timeout": 0.3}})
    run = short_tmp / "run"
    # not --until-idle: 3,000 lines take about a second, so an idle exit could come before
    # the counts are read (the control socket gone, the poll below timed out in CI); the
    # daemon runs until every line is handled and is then stopped as an operator would
    daemon = start_daemon(config)
    ctx = zmq.Context()
    sent = 0
    try:
        wait_until((run / "control.sock").exists, timeout=30, message="the daemon up")
        wait_until(lambda: len(read_records(str(short_tmp / "out"), "batch-")) > 100,
                   timeout=60, message="messages to flow")
        rng = random.Random(7)
        targets = ["producer_0", "processor_default_0", "batcher_even"]
        for target in targets:
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.IDENTITY, f"intruder-{target}".encode())
            sock.setsockopt(zmq.LINGER, 1000)
            sock.connect(f"ipc://{run}/{target}.sock")
            for parts in hostile_frames(rng, 200):
                sock.send_multipart(parts)
                sent += 1
            sock.close()

        def malformed() -> dict[str, int]:
            out = cli("status", "--json", "--socket", str(run / "control.sock"))
            if out.returncode != 0:
                return {}
            return {node["id"]: node.get("messages", {}).get("malformed", 0)
                    for node in snapshot_nodes(json.loads(out.stdout)["tree"])
                    if node["id"] in targets}

        counts = wait_until(lambda: (m := malformed()) and all(m.get(t, 0) > 0 for t in targets)
                            and m, timeout=30, message="the stages to count what they dropped")
        wait_until(lambda: len(read_records(str(short_tmp / "out"), "batch-")) >= n,
                   timeout=120, interval=0.1, message="every line handled")
        daemon.send_signal(signal.SIGTERM)
        _, err = daemon.communicate(timeout=120)
        code = daemon.returncode
    finally:
        ctx.term()
        if daemon.poll() is None:
            daemon.kill()
    assert code == 0, err[-3000:]
    print(f"{sent} hostile frames sent; dropped and counted: {counts}")
    handled = Counter(r["id"] for r in read_records(str(short_tmp / "out"), "batch-"))
    assert len(handled) == n and max(handled.values()) == 1
