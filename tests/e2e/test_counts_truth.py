"""One count per message, and a summary printed only once the books are final: what the
run's last lines say against what really happened (the spool's own record of acked lines,
the rows written), across a run-again pass after a kill in the drain."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, offbroadway_cmd, test_env, wait_until
from tests.e2e.handlers import read_records
from tests.e2e.test_contract import HANDLER, _node, _spool, _status
from tests.e2e.test_pipeline import make_config


@pytest.mark.parametrize("later", [False, pytest.param(True, marks=pytest.mark.slow),
                                   pytest.param(True, marks=pytest.mark.slow)],
                         ids=["at-once", "later", "later-again"])
def test_six_lines_and_a_batch_processor_killed_in_the_drain_say_six_acked(
        short_tmp: Path, later: bool) -> None:
    """The kill lands at the drain's start, or right after two batches were acked (their
    count reached the daemon only if the producer reported again before the run again
    restarted it: the race is run twice)."""
    n = 6
    _spool(short_tmp, [{"seq": i} for i in range(n)])
    config = make_config(short_tmp, handler=HANDLER, context={"batch_slow": 1.0},
                         batchers={"default": {"batch_size": 2, "batch_timeout": 0.1,
                                               "concurrency": 2}})
    sock = short_tmp / "run" / "control.sock"
    daemon = subprocess.Popen(offbroadway_cmd("run", str(config), "--until-idle"), cwd=REPO,
                              env=test_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        s = wait_until(lambda: (st := _status(sock)) and st.get("draining") and st,
                       timeout=90, interval=0.05, message="the drain to begin")
        victim = _node(s["tree"], "batch_processor_default_0")
        assert victim.get("pid"), victim
        if later:
            # two batches written and acked just now (within the stages' report tick), the
            # third held: their count must survive the run again
            wait_until(lambda: len(read_records(str(short_tmp / "out"), "batch-")) >= 4,
                       timeout=30, interval=0.01, message="two batches written")
        os.kill(victim["pid"], signal.SIGKILL)
        out, err = daemon.communicate(timeout=180)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert daemon.returncode == 0, err[-3000:]
    assert "running again until idle" in err, err[-3000:]
    written = {r["id"] for r in read_records(str(short_tmp / "out"), "batch-")}
    assert len(written) == n
    assert not list((short_tmp / "spool").glob("*.jsonl")), "lines left unacked"
    summary = [ln for ln in out.splitlines() if "messages acked" in ln]
    assert summary == [f"e2e: {n} messages acked, 0 failed"], out + err[-3000:]


def test_acks_flowing_when_a_batch_processor_dies_in_the_drain_are_all_counted(
        short_tmp: Path) -> None:
    """Acks flow every few milliseconds when the kill lands: the producers are restarted
    for the run again well within their report tick, so whatever they acked since their
    last report is counted only through the report each stage sends as it exits."""
    n = 400
    _spool(short_tmp, [{"seq": i} for i in range(n)])
    config = make_config(short_tmp, handler=HANDLER, context={"batch_slow": 0.03},
                         batchers={"default": {"batch_size": 5, "batch_timeout": 0.1,
                                               "concurrency": 2}})
    sock = short_tmp / "run" / "control.sock"
    daemon = subprocess.Popen(offbroadway_cmd("run", str(config), "--until-idle"), cwd=REPO,
                              env=test_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        s = wait_until(lambda: (st := _status(sock)) and st.get("draining") and st,
                       timeout=90, interval=0.05, message="the drain to begin")
        victim = _node(s["tree"], "batch_processor_default_0")
        assert victim.get("pid"), victim
        os.kill(victim["pid"], signal.SIGKILL)
        out, err = daemon.communicate(timeout=180)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert daemon.returncode == 0, err[-3000:]
    assert "running again until idle" in err, err[-3000:]
    assert not list((short_tmp / "spool").glob("*.jsonl")), "lines left unacked"
    summary = [ln for ln in out.splitlines() if "messages acked" in ln]
    assert summary == [f"e2e: {n} messages acked, 0 failed"], out + err[-3000:]


def _ledger_acked(tmp: Path, name: str = "part-000.jsonl") -> int:
    """Lines the spool's own ack record says are settled (the source of truth)."""
    from offbroadway.stages.sources.spool.ledger import parse

    try:
        raw = (tmp / "state" / "spool" / f"{name}.acked").read_bytes()
    except FileNotFoundError:
        return 0
    return sum(hi - lo + 1 for lo, hi in parse(raw).ranges)


def test_acks_a_producer_made_before_its_sigkill_are_all_counted(short_tmp: Path) -> None:
    """A producer SIGKILLed mid-run, while acks flow, sends no report as it exits: the
    lines it acked at the spool (durably, in the ack record) since its last report must
    still be counted, since no one reads them again."""
    n = 1000
    _spool(short_tmp, [{"seq": i} for i in range(n)])
    config = make_config(short_tmp, handler=HANDLER, context={"batch_slow": 0.03},
                         batchers={"default": {"batch_size": 5, "batch_timeout": 0.1,
                                               "concurrency": 2}})
    sock = short_tmp / "run" / "control.sock"
    daemon = subprocess.Popen(offbroadway_cmd("run", str(config), "--until-idle"), cwd=REPO,
                              env=test_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        s = wait_until(lambda: (st := _status(sock)) and _node(st["tree"], "producer_0")
                       .get("messages", {}).get("acked") and st,
                       timeout=90, interval=0.05, message="the producer's first acks reported")
        victim = _node(s["tree"], "producer_0")
        reported = victim["messages"]["acked"]
        # acks flowing at the source past what the producer last reported
        wait_until(lambda: _ledger_acked(short_tmp) >= reported + 20, timeout=30,
                   interval=0.005, message="acks at the spool past the last report")
        assert _ledger_acked(short_tmp) < n - 100, "the run ended before the kill"
        os.kill(victim["pid"], signal.SIGKILL)
        out, err = daemon.communicate(timeout=180)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert daemon.returncode == 0, err[-3000:]
    assert "killed by SIGKILL" in err, err[-3000:]
    assert not list((short_tmp / "spool").glob("*.jsonl")), "lines left unacked"
    summary = [ln for ln in out.splitlines() if "messages acked" in ln]
    assert summary == [f"e2e: {n} messages acked, 0 failed"], out + err[-3000:]


@pytest.mark.spark
def test_six_lines_into_spark_and_a_batch_processor_killed_in_the_drain(
        short_tmp: Path, spark_server) -> None:
    """The same with real Spark: six rows written, six messages acked, and the summary
    says both (the run again's pass alone acked fewer)."""
    from tests.spark.test_pipeline_spark import TOKEN_ENV, daemon_env, rows, spark_section

    n = 6
    _spool(short_tmp, [{"seq": i} for i in range(n)])
    out = short_tmp / "dataset"
    config = make_config(short_tmp, handler=HANDLER, context={"batch_slow": 1.0},
                         batchers={"default": {"batch_size": 2, "batch_timeout": 0.1,
                                               "concurrency": 2}})
    config.write_text(config.read_text() + spark_section(
        out, remote=spark_server.remote, token_env=TOKEN_ENV, commit_interval=0.1))
    sock = short_tmp / "run" / "control.sock"
    daemon = subprocess.Popen(offbroadway_cmd("run", str(config), "--until-idle"), cwd=REPO,
                              env=daemon_env(spark_server), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        s = wait_until(lambda: (st := _status(sock)) and st.get("draining") and st,
                       timeout=120, interval=0.05, message="the drain to begin")
        victim = _node(s["tree"], "batch_processor_default_0")
        assert victim.get("pid"), victim
        os.kill(victim["pid"], signal.SIGKILL)
        stdout, err = daemon.communicate(timeout=300)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert daemon.returncode == 0, err[-3000:]
    assert "running again until idle" in err, err[-3000:]
    written = rows(out, "default")
    assert sorted(r["seq"] for r in written) == list(range(n))
    assert f"e2e: wrote {n} rows to {out}/default (parquet)" in stdout, stdout
    assert f"e2e: {n} messages acked, 0 failed" in stdout, stdout + err[-3000:]
