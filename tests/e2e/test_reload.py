"""Reload (SIGHUP, ``offbroadway reload``): the rate limit, log level and a batcher's
batch size and timeout change live, and survive a restart of the stage; any other change
is refused with one line naming the key, and the running pipeline is untouched."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

from tests.conftest import REPO, offbroadway_cmd, start_daemon, test_env, wait_until
from tests.e2e.handlers import read_records
from tests.e2e.test_pipeline import make_config


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(offbroadway_cmd(*args), cwd=REPO, env=test_env(),
                          capture_output=True, text=True, timeout=60)


def sizes_since(out: Path, skip: int) -> list[int]:
    return [r["size"] for r in read_records(str(out), "batch-")[skip:]
            if r["trigger"] == "size"]


def sizes_from_first(out: Path, size: int) -> list[int]:
    """Full batches' sizes from the first one of ``size`` on (one batch processor writes
    them in the order the batcher emitted them; the ones emitted before a reload may
    still be on their way after it)."""
    sizes = sizes_since(out, 0)
    return sizes[sizes.index(size):] if size in sizes else []


def test_resize_emits_what_the_new_size_already_fills() -> None:
    from offbroadway.stages.flow.batching import BatchAccumulator

    acc: BatchAccumulator = BatchAccumulator(50, 30.0)
    assert acc.add_many([("k", i) for i in range(45)], now=1.0) == []
    out = acc.resize(20, 5.0)
    assert [(k, len(b), t) for k, b, t in out] == [("k", 20, "size"), ("k", 20, "size")]
    assert len(acc) == 5 and acc.next_deadline() == 6.0     # the remainder keeps its time
    assert [len(b) for _, b, _ in acc.add_many([("k", i) for i in range(15)], 2.0)] == [20]


def test_reload_applies_live_keys_and_refuses_the_rest(short_tmp: Path) -> None:
    config = make_config(short_tmp, source="generator", options={"payload_bytes": 10},
                         batchers={"default": {"batch_size": 50, "batch_timeout": 30.0}})
    base = config.read_text().replace(
        "[producer.options]",
        "rate_limit = { allowed_messages = 200, interval = 0.5 }\n\n[producer.options]")
    config.write_text(base)
    sock = str(short_tmp / "run" / "control.sock")
    out = short_tmp / "out"
    daemon = start_daemon(config)
    try:
        wait_until(lambda: len(sizes_since(out, 0)) >= 200, timeout=60,
                   message="full batches of 50")
        assert set(sizes_since(out, 0)) == {50}

        # SIGHUP with a smaller batch, a lower limit and debug logging
        config.write_text(base.replace("allowed_messages = 200", "allowed_messages = 100")
                          .replace("batch_size = 50", "batch_size = 20")
                          .replace("[runtime]", '[runtime]\nlog_level = "debug"'))
        daemon.send_signal(signal.SIGHUP)
        wait_until(lambda: json.loads(cli("status", "--json", "--socket", sock).stdout)
                   ["rate_limit"]["allowed_messages"] == 100, timeout=30,
                   message="the new rate limit")
        wait_until(lambda: len(sizes_from_first(out, 20)) >= 50, timeout=60,
                   message="batches of 20")
        assert set(sizes_from_first(out, 20)) == {20}

        # a restarted batcher starts with the reloaded values, not the first config's
        assert cli("restart", "batcher_default", "--socket", sock).returncode == 0
        seen = len(read_records(str(out), "batch-"))
        wait_until(lambda: len(sizes_since(out, seen)) >= 30, timeout=60,
                   message="batches after the restart")
        assert set(sizes_since(out, seen)) == {20}

        # nothing else changes live: refused, one line naming the key, nothing changed
        for old, new, key in [("max_demand = 10", "max_demand = 30",
                               "processors.default.max_demand"),
                              # processors' concurrency resizes live (test_resize.py);
                              # the producers' does not
                              ("concurrency = 1", "concurrency = 2",
                               "producer.concurrency"),
                              ('handler = "tests.e2e.handlers:Recorder"',
                               'handler = "tests.e2e.handlers:NoBatch"', "pipeline.handler")]:
            assert old in base, old
            config.write_text(base.replace(old, new).replace("allowed_messages = 200",
                                                             "allowed_messages = 7"))
            res = cli("reload", "--socket", sock)
            assert res.returncode == 1, res
            lines = res.stderr.strip().splitlines()
            assert len(lines) == 1 and f"reload refused: {key}:" in lines[0], res.stderr
            assert "nothing was changed" in lines[0]
        config.write_text(base.replace("allowed_messages = 200", "allowed_messages = 7")
                          .replace("[runtime]", "[runtime]\nlog_level = 3"))
        res = cli("reload", "--socket", sock)
        assert res.returncode == 1 and "runtime.log_level" in res.stderr, res
        status = json.loads(cli("status", "--json", "--socket", sock).stdout)
        assert status["rate_limit"]["allowed_messages"] == 100, "a refused reload changed it"
        seen = len(read_records(str(out), "batch-"))
        wait_until(lambda: len(sizes_since(out, seen)) >= 5, timeout=60,
                   message="the pipeline still running after the refusals")
        assert set(sizes_since(out, seen)) == {20}

        # the CLI says what a reload applied
        config.write_text(base.replace("batch_size = 50", "batch_size = 20")
                          .replace("[runtime]", '[runtime]\nlog_level = "debug"'))
        res = cli("reload", "--socket", sock)
        assert res.returncode == 0 and "producer.rate_limit 100/0.5s -> 200/0.5s" in \
            res.stdout, res
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            _, err = daemon.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            _, err = daemon.communicate(timeout=30)
    assert daemon.returncode == 0, err[-3000:]
    assert "SIGHUP reload: " in err, err[-3000:]
    # each process says its new level at that level: shown only if it is in force
    for who in ("daemon", "producer_0", "processor_default_0", "batcher_default"):
        assert f"DEBUG [{who}]" in err, f"{who} did not switch to debug logging"
