"""SIGTERM in the middle of a busy run: the drain finishes what was fetched, exactly once.

The shape of ``bench/stop_latency.py`` (which times this stop; no timing is asserted here):
an endless generator → 2 processors → a batcher of 100 → 1 batch processor whose
handle_batch records every message it saw (fsync'd, so a record exists iff the callback
completed).  The daemon logs, after the drain, what each source fetched and acked; every
fetched message must be in the records exactly once.
"""

from __future__ import annotations

import re
import signal
import time
from collections import Counter
from pathlib import Path

from tests.conftest import start_daemon, wait_until
from tests.e2e.handlers import read_records
from tests.e2e.test_pipeline import make_config

BOOKS = re.compile(r"(producer_\S+): source generator fetched (\d+), acked (\d+), "
                   r"failed (\d+), unacked (\d+)")


def test_sigterm_mid_run_hands_every_fetched_message_to_handle_batch_once(
        short_tmp: Path) -> None:
    config = make_config(short_tmp, source="generator", options={"payload_bytes": 16},
                         batchers={"default": {"batch_size": 100, "batch_timeout": 1.0}})
    out = short_tmp / "out"
    daemon = start_daemon(config)
    try:
        wait_until(lambda: daemon.poll() is not None or read_records(str(out), "batch-"),
                   timeout=60, interval=0.05, message="the first batch")
        assert daemon.poll() is None, daemon.stderr.read()[-3000:]
        time.sleep(1.0)   # the scenario: the stop comes 1 s into a busy run
        daemon.send_signal(signal.SIGTERM)
        stdout, stderr = daemon.communicate(timeout=60)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.communicate()
    assert daemon.returncode == 0, stderr[-3000:]
    books = BOOKS.findall(stderr)
    assert len(books) == 1, f"expected the producer's books after the drain:\n{stderr[-3000:]}"
    _, fetched, acked, failed, unacked = (int(x) if x.isdigit() else x for x in books[0])
    counts = Counter(r["id"] for r in read_records(str(out), "batch-"))
    assert fetched > 0
    assert (failed, unacked) == (0, 0), books[0]
    # the generator's ids are "0-<seq>" with seq 0, 1, 2 … in fetch order
    assert set(counts) == {f"0-{i}" for i in range(fetched)}, (
        f"fetched {fetched}, {len(counts)} distinct ids reached handle_batch")
    dupes = {k: v for k, v in counts.items() if v > 1}
    assert not dupes, f"{len(dupes)} messages reached handle_batch more than once"
    assert acked == fetched
    assert f"{fetched} messages acked, 0 failed" in stdout
