"""The whole daemon writing to real Spark.

Most tests point the daemon at the suite's shared Connect server (``remote`` plus a token
from an environment variable, the way a real cluster is configured), so they do not pay a
JVM start each; one test lets the daemon start and supervise its own server and SIGKILLs
it mid-run.  Output is read back with pyarrow: what Spark committed, nothing else.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, offbroadway_cmd, start_daemon, test_env, wait_until
from tests.e2e.handlers import read_records
from tests.e2e.test_pipeline import make_config, stage_pids, write_spool

pytestmark = pytest.mark.spark
TOKEN_ENV = "OB_TEST_SPARK_TOKEN"


def spark_section(output: Path, **extra) -> str:
    lines = [f"output = {json.dumps(str(output))}", *(f"{k} = {json.dumps(v)}"
                                                       for k, v in extra.items())]
    return "\n[spark]\n" + "\n".join(lines) + "\n"


def daemon_env(server) -> dict[str, str]:
    return {**test_env(), TOKEN_ENV: server.token}


def rows(output: Path, batcher: str) -> list[dict]:
    """What Spark committed.  While a writer runs, its ``_temporary`` dirs come and go
    under the listing: read again rather than fail (the final read has no writer)."""
    path = output / batcher
    for _ in range(20):
        if not path.exists():
            return []
        try:
            return pq.read_table(path).to_pylist()
        except FileNotFoundError:
            continue
    raise AssertionError(f"could not list {path} while it was being written")


def run(config: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(offbroadway_cmd("run", str(config), "--until-idle"), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_every_line_lands_once_with_two_concurrent_writers(short_tmp: Path, spark_server) -> None:
    n = 6000
    write_spool(short_tmp / "spool", n, files=3)
    out = short_tmp / "dataset"
    config = make_config(short_tmp, batchers={
        "even": {"batch_size": 500, "batch_timeout": 0.5, "concurrency": 2},
        "odd": {"batch_size": 500, "batch_timeout": 0.5}})
    config.write_text(config.read_text() + spark_section(
        out, remote=spark_server.remote, token_env=TOKEN_ENV))
    proc = run(config, daemon_env(spark_server))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert spark_server.token not in proc.stdout + proc.stderr
    even, odd = rows(out, "even"), rows(out, "odd")
    seqs = Counter(r["seq"] for r in even + odd)
    assert len(seqs) == n and max(seqs.values()) == 1
    assert {r["seq"] % 2 for r in even} == {0} and {r["seq"] % 2 for r in odd} == {1}
    assert all(r["message_id"] and r["ingested_at"] is not None for r in even + odd)
    assert len({r["writer"] for r in even}) == 2, "both even batch processors wrote"
    assert f"wrote {len(even)} rows to {out}/even" in proc.stdout
    assert not list((short_tmp / "spool").glob("*.jsonl")), "spool not fully acked"


def test_a_row_that_breaks_the_schema_fails_only_its_message(short_tmp: Path,
                                                             spark_server) -> None:
    spool = short_tmp / "spool"
    spool.mkdir()
    lines = [{"seq": i, "route": "default"} for i in range(20)]
    lines[7]["seq"] = "seven"                       # not a BIGINT
    (spool / "a.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = short_tmp / "dataset"
    config = make_config(short_tmp, batchers={"default": {"batch_size": 100,
                                                           "batch_timeout": 0.3}})
    config.write_text(config.read_text() + spark_section(
        out, remote=spark_server.remote, token_env=TOKEN_ENV,
        schema="seq BIGINT, route STRING"))
    proc = run(config, daemon_env(spark_server))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(r["seq"] for r in rows(out, "default")) == [i for i in range(20) if i != 7]
    failed = read_records(str(short_tmp / "out"), "failed-")
    assert [f["id"] for f in failed] == ["a.jsonl:8"], failed
    assert "seq" in failed[0]["reason"]


def test_sigterm_mid_run_writes_the_partial_batches_and_loses_nothing(short_tmp: Path,
                                                                      spark_server) -> None:
    n, size = 8000, 1000
    write_spool(short_tmp / "spool", n, files=2)
    out = short_tmp / "dataset"
    config = make_config(short_tmp, context={"slow": 0.005}, batchers={
        "even": {"batch_size": size, "batch_timeout": 60.0},
        "odd": {"batch_size": size, "batch_timeout": 60.0}})
    config.write_text(config.read_text() + spark_section(
        out, remote=spark_server.remote, token_env=TOKEN_ENV))
    env = daemon_env(spark_server)
    daemon = subprocess.Popen(offbroadway_cmd("run", str(config)), cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # reading the dataset back costs CPU the daemon needs: poll gently
        wait_until(lambda: len(rows(out, "even")) + len(rows(out, "odd")) >= 2 * size,
                   timeout=120, interval=0.5, message="a few batches written")
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(120)
    finally:
        if daemon.poll() is None:
            daemon.kill()
    assert code == 0, daemon.stderr.read()[-3000:]
    first = Counter(r["seq"] for r in rows(out, "even") + rows(out, "odd"))
    # the partial batches were flushed on the drain: not a multiple of batch_size
    assert len(first) % size != 0 and len(first) < n
    proc = run(config, env)                      # the rest, and only the rest
    assert proc.returncode == 0, proc.stderr[-3000:]
    total = Counter(r["seq"] for r in rows(out, "even") + rows(out, "odd"))
    assert len(total) == n and max(total.values()) == 1


def start_against_dead_spark(tmp: Path, lines: int, write_retry_seconds: float
                             ) -> tuple[subprocess.Popen, Path, dict[str, str]]:
    """A daemon whose sink points at a Spark Connect port nobody listens on: ``lines``
    spool lines, one batcher of 50; returns the daemon, its stderr log and its env."""
    spool = tmp / "spool"
    spool.mkdir()
    (spool / "part-000.jsonl").write_text("".join(
        json.dumps({"seq": i, "route": "default"}) + "\n" for i in range(lines)))
    config = make_config(tmp, shutdown_timeout=5.0, batchers={
        "default": {"batch_size": 50, "batch_timeout": 0.2}})
    config.write_text(config.read_text() + spark_section(
        tmp / "dataset", remote="sc://localhost:9", token_env=TOKEN_ENV,
        write_retry_seconds=write_retry_seconds))
    env = {**test_env(), TOKEN_ENV: "not-a-real-token"}
    log = tmp / "daemon.err"
    with open(log, "w") as err_file:
        daemon = subprocess.Popen(offbroadway_cmd("run", str(config)), cwd=REPO, env=env,
                                  stdout=subprocess.DEVNULL, stderr=err_file, text=True)
    return daemon, log, env


def test_spark_down_retries_and_acks_nothing(short_tmp: Path) -> None:
    out = short_tmp / "dataset"
    daemon, log, _env = start_against_dead_spark(short_tmp, 200, write_retry_seconds=30.0)
    try:
        try:
            wait_until(lambda: "retrying" in log.read_text(), timeout=90,
                       message="the sink to report retries")
        except AssertionError:
            raise AssertionError(log.read_text()[-3000:]) from None
        assert not rows(out, "default")
        assert not (short_tmp / "spool" / "done").exists()
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(60)
    finally:
        if daemon.poll() is None:
            daemon.kill()
    assert code == 0
    err = log.read_text()
    assert "UNAVAILABLE" in err and "not-a-real-token" not in err
    # nothing acked and nothing dead-lettered: every line is still waiting in the spool
    assert len((short_tmp / "spool" / "part-000.jsonl").read_text().splitlines()) == 200
    assert not (short_tmp / "state" / "spool" / "dead-letter.jsonl").exists()


def test_a_batch_processor_stopped_while_spark_is_down_exits_at_once(short_tmp: Path) -> None:
    """Regression (bench/chaos.py): a batch processor told to stop (here an operator
    restart; in the chaos run the rest_for_one restart after a Spark server crash) while
    its write was retrying kept retrying until SIGKILL at its shutdown deadline.  Now it
    abandons the write at the next back-off, acks nothing and exits."""
    daemon, log, env = start_against_dead_spark(short_tmp, 50, write_retry_seconds=600.0)
    try:
        wait_until(lambda: "retrying" in log.read_text(), timeout=90,
                   message="the sink to report retries")
        restart = subprocess.run(
            offbroadway_cmd("restart", "batch_processor_default_0", "--socket",
                            str(short_tmp / "run" / "control.sock")),
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert restart.returncode == 0, restart.stderr
        text = log.read_text()
        assert "left unacked (Spark write abandoned" in text, text[-3000:]
        assert "after SIGTERM: SIGKILL" not in text, "the batch processor waited for SIGKILL"
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(60)
    finally:
        if daemon.poll() is None:
            daemon.kill()
    assert code == 0
    # nothing acked, nothing dead-lettered: every line is still waiting in the spool
    assert len((short_tmp / "spool" / "part-000.jsonl").read_text().splitlines()) == 50
    assert not (short_tmp / "state" / "spool" / "dead-letter.jsonl").exists()


def test_sigkill_of_the_daemons_own_spark_server_loses_nothing(short_tmp: Path) -> None:
    """The daemon starts and supervises its own server; its JVM is SIGKILLed mid-run.
    rest_for_one restarts everything after it; the output holds every line at least once."""
    import psutil

    n = 12_000
    write_spool(short_tmp / "spool", n, files=3)
    out = short_tmp / "dataset"
    config = make_config(short_tmp, context={"slow": 0.001}, shutdown_timeout=60.0, batchers={
        "even": {"batch_size": 1000, "batch_timeout": 1.0},
        "odd": {"batch_size": 1000, "batch_timeout": 1.0}})
    config.write_text(config.read_text() + spark_section(out, master="local[1]"))
    sock = short_tmp / "run" / "control.sock"
    daemon = start_daemon(config, "--until-idle")
    try:
        wait_until(lambda: len(rows(out, "even")) + len(rows(out, "odd")) >= 2000, timeout=400,
                   message="the first batches written")
        wrapper = stage_pids(sock)["spark"]
        jvm = next(p for p in psutil.Process(wrapper).children() if "java" in p.name())
        jvm.kill()
        code = daemon.wait(600)
    finally:
        if daemon.poll() is None:
            daemon.kill()
    err = daemon.stderr.read()
    assert code == 0, err[-3000:]
    assert "spark" in err and "restart" in err.lower()
    seqs = Counter(r["seq"] for r in rows(out, "even") + rows(out, "odd"))
    assert len(seqs) == n, f"{n - len(seqs)} lines missing after the Spark server was killed"
    print(f"duplicates after killing the Spark JVM: {sum(seqs.values()) - n}")
    assert not list((short_tmp / "spool").glob("*.jsonl"))
