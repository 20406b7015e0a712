"""One count per message, and a summary printed only once the books are final: what the
run's last lines say against what really happened (the spool's own record of acked lines,
the rows written), across a run-again pass after a kill in the drain."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, offbroadway_cmd, wait_until
from tests.e2e.handlers import read_records
from tests.e2e.test_contract import HANDLER, _node, _spool, _status
from tests.e2e.test_pipeline import make_config, run_until_idle_while


def _run_with_a_kill(tmp: Path, n: int, batch_slow: float, batch_size: int,
                     kill: Callable[[Path], None]) -> tuple[str, str]:
    """``n`` spool lines through batch processors that take ``batch_slow`` a batch,
    ``run --until-idle``, and ``kill(control_socket)`` once it is running: stdout and
    stderr, after the run checked to have exited 0 with the spool fully acked."""
    _spool(tmp, [{"seq": i} for i in range(n)])
    config = make_config(tmp, handler=HANDLER, context={"batch_slow": batch_slow},
                         batchers={"default": {"batch_size": batch_size,
                                               "batch_timeout": 0.1, "concurrency": 2}})
    code, out, err = run_until_idle_while(config, lambda: kill(tmp / "run" / "control.sock"))
    assert code == 0, err[-3000:]
    assert not list((tmp / "spool").glob("*.jsonl")), f"lines left unacked: {err[-3000:]}"
    return out, err


def _summary_says(out: str, err: str, n: int) -> None:
    summary = [ln for ln in out.splitlines() if "messages acked" in ln]
    assert summary == [f"e2e: {n} messages acked, 0 failed"], out + err[-3000:]


def _in_the_drain(sock: Path) -> dict:
    """The drain's first status, with the batch processor to kill in it."""
    s = wait_until(lambda: (st := _status(sock)) and st.get("draining") and st,
                   timeout=90, interval=0.05, message="the drain to begin")
    victim = _node(s["tree"], "batch_processor_default_0")
    assert victim.get("pid"), victim
    return victim


@pytest.mark.parametrize("later", [False, pytest.param(True, marks=pytest.mark.slow),
                                   pytest.param(True, marks=pytest.mark.slow)],
                         ids=["at-once", "later", "later-again"])
def test_six_lines_and_a_batch_processor_killed_in_the_drain_say_six_acked(
        short_tmp: Path, later: bool) -> None:
    """The kill lands at the drain's start, or right after two batches were acked (their
    count reached the daemon only if the producer reported again before the run again
    restarted it: the race is run twice)."""
    n = 6

    def kill(sock: Path) -> None:
        victim = _in_the_drain(sock)
        if later:
            # two batches written and acked just now (within the stages' report tick), the
            # third held: their count must survive the run again
            wait_until(lambda: len(read_records(str(short_tmp / "out"), "batch-")) >= 4,
                       timeout=30, interval=0.01, message="two batches written")
        os.kill(victim["pid"], signal.SIGKILL)

    out, err = _run_with_a_kill(short_tmp, n, 1.0, 2, kill)
    assert "running again until idle" in err, err[-3000:]
    written = {r["id"] for r in read_records(str(short_tmp / "out"), "batch-")}
    assert len(written) == n
    _summary_says(out, err, n)


def test_acks_flowing_when_a_batch_processor_dies_in_the_drain_are_all_counted(
        short_tmp: Path) -> None:
    """Acks flow every few milliseconds when the kill lands: the producers are restarted
    for the run again well within their report tick, so whatever they acked since their
    last report is counted only through the report each stage sends as it exits."""
    n = 400
    out, err = _run_with_a_kill(short_tmp, n, 0.03, 5,
                                lambda sock: os.kill(_in_the_drain(sock)["pid"],
                                                     signal.SIGKILL))
    assert "running again until idle" in err, err[-3000:]
    _summary_says(out, err, n)


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

    def kill(sock: Path) -> None:
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

    out, err = _run_with_a_kill(short_tmp, n, 0.03, 5, kill)
    assert "killed by SIGKILL" in err, err[-3000:]
    _summary_says(out, err, n)


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
