"""The whole daemon writing to real Spark.

Most tests point the daemon at the suite's shared Connect server (``remote`` plus a token
from an environment variable, the way a real cluster is configured), so they do not pay a
JVM start each; two tests let the daemon start and supervise its own server and SIGKILL
its JVM during a commit: mid-run, and in the ``--until-idle`` drain.
Output is read back with pyarrow: what Spark committed, nothing else.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from offbroadway.daemon.core.outcome import EXIT_FAILED
from offbroadway.supervision.tree import snapshot_find, snapshot_nodes

from tests.conftest import REPO, offbroadway_cmd, test_env, wait_until
from tests.e2e.handlers import read_records
from tests.e2e.test_pipeline import make_config, stage_pids, write_spool
from tests.spark.dataset import assert_each_message_exactly_once, rows

pytestmark = pytest.mark.spark
TOKEN_ENV = "OB_TEST_SPARK_TOKEN"


def spark_section(output: Path, **extra) -> str:
    lines = [f"output = {json.dumps(str(output))}", *(f"{k} = {json.dumps(v)}"
                                                       for k, v in extra.items())]
    return "\n[spark]\n" + "\n".join(lines) + "\n"


def daemon_env(server) -> dict[str, str]:
    return {**test_env(), TOKEN_ENV: server.token}


def status(control_socket: Path) -> dict:
    """The running daemon's ``status --json`` ({} while it does not answer)."""
    out = subprocess.run(offbroadway_cmd("status", "--json", "--socket", str(control_socket)),
                         cwd=REPO, env=test_env(), capture_output=True, text=True, timeout=30)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def stage_stats(st: dict) -> dict[str, dict]:
    """Stage id → the counters it last reported, from a status."""
    if not st:
        return {}
    return {node["id"]: node["messages"] for node in snapshot_nodes(st["tree"])
            if node.get("messages")}


def committing(control_socket: Path, committer: str) -> bool:
    """The committer reported a Spark job running, after at least one committed."""
    s = stage_stats(status(control_socket)).get(committer, {})
    return s.get("committing", 0) > 0 and s.get("commits", 0) > 0


def run(config: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(offbroadway_cmd("run", str(config), "--until-idle"), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_two_keys_times_two_batch_processors_give_one_row_per_message(short_tmp: Path,
                                                                       spark_server) -> None:
    """Two batcher keys x two batch processors writing at once: each key is one dataset
    (one committer each) with exactly one row per message and no column of the layout."""
    n = 6000
    write_spool(short_tmp / "spool", n, files=3)
    out = short_tmp / "dataset"
    # 2 ms per message (6 s over the two processors): the batches form while both batch
    # processors of each key have subscribed; at full speed the first to subscribe could
    # take every batch before the second asked (seen in CI: one file for "even"; and with
    # 1 ms a message, once, none for one of "odd"'s two under a loaded CI run)
    config = make_config(short_tmp, context={"slow": 0.002}, batchers={
        "even": {"batch_size": 250, "batch_timeout": 0.5, "concurrency": 2},
        "odd": {"batch_size": 250, "batch_timeout": 0.5, "concurrency": 2}})
    config.write_text(config.read_text() + spark_section(
        out, remote=spark_server.remote, token_env=TOKEN_ENV, commit_rows=2000,
        commit_interval=0.5))
    proc = run(config, daemon_env(spark_server))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert spark_server.token not in proc.stdout + proc.stderr
    even, odd = rows(out, "even"), rows(out, "odd")
    seqs = Counter(r["seq"] for r in even + odd)
    assert len(seqs) == n and max(seqs.values()) == 1
    assert {r["seq"] % 2 for r in even} == {0} and {r["seq"] % 2 for r in odd} == {1}
    assert all(r["message_id"] and r["ingested_at"] is not None for r in even + odd)
    assert set(even[0]) == set(odd[0]) and "writer" not in even[0]
    assert {"seq", "route", "message_id", "ingested_at"} <= set(even[0])
    # one dataset per key: part files straight under <output>/<key>, no directory per
    # writer, and nothing left staged
    assert sorted(p.name for p in out.iterdir()) == ["even", "odd"]
    for key in ("even", "odd"):
        assert not [p for p in (out / key).iterdir()
                    if p.is_dir() and not p.name.startswith("_")], key
        assert not list((out / key).glob("_staging*")), key
    # both batch processors of each key handed batches to its committer
    # (the test handler records each batch in a file named by its process)
    by_key: dict[str, set[str]] = {"even": set(), "odd": set()}
    for f in (short_tmp / "out").glob("batch-*.jsonl"):
        for line in f.read_text().splitlines():
            by_key[json.loads(line)["batcher"]].add(f.name)
    assert all(len(files) == 2 for files in by_key.values()), by_key
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
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]   # finished, one message failed
    assert sorted(r["seq"] for r in rows(out, "default")) == [i for i in range(20) if i != 7]
    failed = read_records(str(short_tmp / "out"), "failed-")
    assert [f["id"] for f in failed] == ["a.jsonl:8"], failed
    assert "seq" in failed[0]["reason"]


# long: not in the default run (pytest -m slow)
@pytest.mark.slow
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
    written = rows(out, "even") + rows(out, "odd")
    first = Counter(r["seq"] for r in written)
    assert len(first) < n
    # the drain flushed each batcher's partial batch (BatchInfo.trigger "flush", as
    # handle_batch saw it) and those batches were committed before the daemon exited
    flushed = [r for r in read_records(str(short_tmp / "out"), "batch-")
               if r["trigger"] == "flush"]
    assert {r["batcher"] for r in flushed} == {"even", "odd"}, flushed[:3]
    assert all(r["size"] < size for r in flushed)
    ids = {r["message_id"] for r in written}
    assert {r["id"] for r in flushed} <= ids, "a flushed batch was not written"
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


# long: not in the default run (pytest -m slow)
@pytest.mark.slow
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


# long: not in the default run (pytest -m slow)
@pytest.mark.slow
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


def own_spark_config(tmp: Path, n: int, *, context: dict, shutdown_timeout: float,
                     batchers: dict) -> Path:
    """A pipeline whose daemon starts and supervises its own Spark server (``local[1]``),
    over ``n`` spool lines routed even/odd; small jobs (2,000 rows, 0.3 s), so that the
    batch processors' window (2 x commit_rows) does not fetch the whole input at once."""
    write_spool(tmp / "spool", n, files=3)
    config = make_config(tmp, context=context, shutdown_timeout=shutdown_timeout,
                         batchers=batchers)
    config.write_text(config.read_text() + spark_section(
        tmp / "dataset", master="local[1]", commit_rows=2000, commit_interval=0.3))
    return config


def start_logged(config: Path, tmp: Path, env: dict[str, str] | None = None
                 ) -> tuple[subprocess.Popen, Path]:
    """``run --until-idle`` with stderr in a file (a pipe nobody reads while the test
    waits would fill and block the daemon's logging)."""
    log = tmp / "daemon.err"
    with open(log, "w") as err_file:
        daemon = subprocess.Popen(offbroadway_cmd("run", str(config), "--until-idle"),
                                  cwd=REPO, env=env or test_env(), stdout=subprocess.PIPE,
                                  stderr=err_file, text=True)
    return daemon, log


def committing_now(sock: Path, *, draining: bool) -> dict:
    """The status, once a committer reports a Spark job running (after one committed)
    and the pipeline is (or is not) draining; else {}."""
    st = status(sock)
    if not st or bool(st.get("draining")) != draining:
        return {}
    stats = stage_stats(st)
    busy = [c for c in ("committer_even", "committer_odd")
            if stats.get(c, {}).get("committing", 0) > 0 and stats[c].get("commits", 0) > 0]
    return st if busy else {}


#: what :func:`sigkill_a_stage` takes for the daemon's own Spark server's JVM
JVM = "jvm"


def sigkill_a_stage(daemon: subprocess.Popen, log: Path,
                    find_pids: Callable[[], dict[str, int]], stage: str) -> str:
    """SIGKILL ``stage`` once ``find_pids()`` (which waits for the moment) names it, and
    wait for ``daemon`` (an ``--until-idle`` run) to end: it must end 0, having said that
    the stage was killed and restarted it.  ``stage`` :data:`JVM`: the JVM of the
    daemon's own Spark server (the server, and everything after it, restarts).  Returns
    the daemon's log; the daemon never outlives this call."""
    try:
        pids = find_pids()
        if stage == JVM:
            the_jvm(pids["spark"]).kill()
        else:
            os.kill(pids[stage], signal.SIGKILL)
        code = daemon.wait(600)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    err = log.read_text()
    assert code == 0, err[-3000:]
    if stage == JVM:
        assert re.search(r"PipelineSupervisor \(rest_for_one\): .*; restarting spark, ",
                         err), err[-3000:]
    else:
        assert f"{stage} (pid {pids[stage]})" in err and "killed by SIGKILL" in err, \
            err[-3000:]
    return err


def kill_the_process_group(daemon: subprocess.Popen, stages: Iterable[int]) -> None:
    """SIGKILL the daemon's whole process group (a ``start_new_session`` daemon) and each
    of its ``stages`` (they run in process groups of their own and die with the daemon:
    made sure of here), and reap the daemon."""
    os.killpg(daemon.pid, signal.SIGKILL)
    for pid in stages:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    daemon.wait(60)


def kill_the_daemon_alone(daemon: subprocess.Popen, stages: Iterable[int]) -> None:
    """SIGKILL the daemon process alone (its stages are left to die of it: PDEATHSIG),
    reap it, and wait until none of its ``stages`` is left (a rerun would find the old
    ones holding the run lock or the dataset's)."""
    import psutil

    daemon.kill()
    daemon.wait(60)

    def gone(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_until(lambda: all(gone(p) for p in stages), timeout=60, interval=0.1,
               message="the daemon's stages to die with it")


def the_jvm(wrapper: int):
    """The Spark server's JVM: the java child of the ``spark`` child (its wrapper)."""
    import psutil

    return next(p for p in psutil.Process(wrapper).children() if "java" in p.name())


def kill_the_jvm_in_a_commit(config: Path, tmp: Path, n: int, *, draining: bool) -> str:
    """Run ``config`` (--until-idle), SIGKILL the Spark JVM once a committer reports a job
    running (mid-run or in the drain), and wait for the exit: it must be 0 with every
    line in the datasets exactly once.  Returns the log."""
    sock = tmp / "run" / "control.sock"
    daemon, log = start_logged(config, tmp)
    try:
        st = wait_until(lambda: committing_now(sock, draining=draining), timeout=400,
                        interval=0.1, message=f"a committer in a Spark job "
                                              f"({'in the drain' if draining else 'mid-run'})")
        the_jvm(snapshot_find(st["tree"], "spark")["pid"]).kill()
        code = daemon.wait(600)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    err = log.read_text()
    assert code == 0, err[-3000:]
    assert re.search(r"PipelineSupervisor \(rest_for_one\): .*; restarting spark, ", err), \
        err[-3000:]
    out = tmp / "dataset"
    try:
        assert_each_message_exactly_once(rows(out, "even") + rows(out, "odd"), n)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{err[-5000:]}") from None
    assert not list((tmp / "spool").glob("*.jsonl")), "lines left unacked"
    return err


# two JVM starts of its own: long: not in the default run (pytest -m slow)
@pytest.mark.slow
def test_sigkill_of_the_daemons_own_spark_server_loses_nothing(short_tmp: Path) -> None:
    """The daemon starts and supervises its own server; its JVM is SIGKILLed while a
    committer runs a Spark job, long before the source is exhausted.  rest_for_one
    restarts everything after it; the output holds every line exactly once."""
    n = 12_000
    # slow enough (~2 s per 1,000 lines over 2 processors) that the source lasts well
    # beyond the first commits: the kill lands mid-run, not in the drain (the next test)
    config = own_spark_config(short_tmp, n, context={"slow": 0.004}, shutdown_timeout=60.0,
                              batchers={"even": {"batch_size": 1000, "batch_timeout": 1.0},
                                        "odd": {"batch_size": 1000, "batch_timeout": 1.0}})
    kill_the_jvm_in_a_commit(config, short_tmp, n, draining=False)


@pytest.mark.slow
def test_sigkill_of_the_spark_server_during_the_drain_runs_again_and_loses_nothing(
        short_tmp: Path) -> None:
    """Regression: the source exhausted, ``--until-idle`` drains, and the Spark JVM is
    SIGKILLed during a commit of the drain.  The server's restart (a JVM start, 15-60 s
    here) restarts every producer, whose sources take back what was in flight: the daemon
    used to finish that drain and exit 0 with those lines unacked.  Now the restart ends
    the drain and the pipeline runs until idle again: exit 0 only with every line
    written.  The restart's terminations must be quick for that (a committer that had
    tried the dead server spent 6-9 s in pyspark's exit hook, and the drain expired
    first); the second drain holds everything the restarted producer fetched, written
    through a cold JVM, hence a minute of shutdown_timeout."""
    n = 6000
    # slow batches (0.5 s in handle_batch, 2 batch processors per key): what is in flight
    # when the source is exhausted takes seconds to drain, with commits all along
    config = own_spark_config(
        short_tmp, n, context={"batch_slow": 0.5}, shutdown_timeout=60.0,
        batchers={key: {"batch_size": 200, "batch_timeout": 0.5, "concurrency": 2}
                  for key in ("even", "odd")})
    config.write_text(config.read_text().replace("tests.e2e.handlers:Recorder",
                                                 "tests.e2e.handlers:Contract"))
    err = kill_the_jvm_in_a_commit(config, short_tmp, n, draining=True)
    assert "running again until idle" in err, err[-3000:]


def one_batcher_into_spark(tmp: Path, server, n: int) -> tuple[Path, Path]:
    """``n`` spool lines (2 ms each in the processors) through one batcher of two batch
    processors into the suite's Spark, 3,000-row commits every half second: a run long
    enough for a kill to land during a commit.  Returns (config, dataset)."""
    write_spool(tmp / "spool", n, files=3, extra={"route": "default"})
    out = tmp / "dataset"
    config = make_config(tmp, context={"slow": 0.002}, shutdown_timeout=30.0, batchers={
        "default": {"batch_size": 500, "batch_timeout": 0.5, "concurrency": 2}})
    config.write_text(config.read_text() + spark_section(
        out, remote=server.remote, token_env=TOKEN_ENV, commit_rows=3000,
        commit_interval=0.5))
    return config, out


def kill_a_stage_in_a_commit(tmp: Path, server, stage: str) -> None:
    """12,000 lines through one batcher of two batch processors into the suite's Spark;
    SIGKILL ``stage`` while the committer runs a Spark job; the run must end 0 with every
    line in the dataset exactly once (stages/spark/spark_once.py: the rows of the commits whose
    answers may not have become acks, and every copy a stale stage or the source's
    redelivery brings again, in a later group or in the same one, are left out)."""
    n = 12_000
    config, out = one_batcher_into_spark(tmp, server, n)
    sock = tmp / "run" / "control.sock"
    daemon, log = start_logged(config, tmp, daemon_env(server))

    def in_a_commit() -> dict[str, int]:
        wait_until(lambda: committing(sock, "committer_default"), timeout=120, interval=0.1,
                   message="the committer in a Spark job")
        return stage_pids(sock)

    err = sigkill_a_stage(daemon, log, in_a_commit, stage)
    try:
        assert_each_message_exactly_once(rows(out, "default"), n)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{err[-5000:]}") from None
    assert not list((tmp / "spool").glob("*.jsonl"))


def test_sigkill_of_a_batch_processor_during_a_commit_loses_nothing(
        short_tmp: Path, spark_server) -> None:
    """Its unacked batches are delivered again (one_for_all restarts its sibling too);
    the rows the running job commits for the dead incarnation are in doubt, and their
    redelivered messages are acknowledged without being written again; so are the
    stale copies the batcher and the processors still hold, whichever copy comes first.
    Every line exactly once."""
    kill_a_stage_in_a_commit(short_tmp, spark_server, "batch_processor_default_0")


# the batch processor's kill is the default run's case; the others are slow
@pytest.mark.slow
def test_sigkill_of_the_committer_during_a_commit_loses_nothing(
        short_tmp: Path, spark_server) -> None:
    """The server interrupts the job of a client that died (its jobs are not
    reattachable) or finishes it; the new committer reads the journal's last stamps back
    from Spark and leaves those rows out when their messages come back, and keeps one
    copy of a message whose stale copy (still in a processor) and redelivery meet in one
    group.  Every line exactly once."""
    kill_a_stage_in_a_commit(short_tmp, spark_server, "committer_default")


# long: not in the default run (pytest -m slow)
@pytest.mark.slow
def test_sigkill_of_the_producer_during_a_commit_loses_nothing(
        short_tmp: Path, spark_server) -> None:
    """The restarted producer's spool reads on from its last acked line, while the
    stages downstream still hold copies of what it had handed out (their acks go to the
    dead producer): the daemon's ``redelivery`` command puts the recent commits and the
    next ones in doubt.  Every line exactly once."""
    kill_a_stage_in_a_commit(short_tmp, spark_server, "producer_0")


@pytest.mark.slow
def test_sigkill_of_the_whole_process_group_then_a_rerun_writes_each_line_once(
        short_tmp: Path, spark_server) -> None:
    """The daemon and every stage SIGKILLed at once during a commit (a power cut for the
    daemon's machine); the next ``run --until-idle`` finishes the spool: every line once."""
    n = 12_000
    write_spool(short_tmp / "spool", n, files=3, extra={"route": "default"})
    out = short_tmp / "dataset"
    config = make_config(short_tmp, context={"slow": 0.002}, shutdown_timeout=30.0,
                         batchers={"default": {"batch_size": 500, "batch_timeout": 0.5,
                                               "concurrency": 2}})
    config.write_text(config.read_text() + spark_section(
        out, remote=spark_server.remote, token_env=TOKEN_ENV, commit_rows=3000,
        commit_interval=0.5))
    sock = short_tmp / "run" / "control.sock"
    log = short_tmp / "daemon.err"
    with open(log, "w") as err_file:
        daemon = subprocess.Popen(offbroadway_cmd("run", str(config), "--until-idle"),
                                  cwd=REPO, env=daemon_env(spark_server),
                                  stdout=subprocess.DEVNULL, stderr=err_file,
                                  start_new_session=True)
    try:
        wait_until(lambda: committing(sock, "committer_default"), timeout=120, interval=0.1,
                   message="the committer in a Spark job")
        kill_the_process_group(daemon, stage_pids(sock).values())
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert daemon.returncode == -signal.SIGKILL
    proc = run(config, daemon_env(spark_server))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_each_message_exactly_once(rows(out, "default"), n)
    assert not list((short_tmp / "spool").glob("*.jsonl"))


def example_config(short_tmp: Path, spool: Path, out: Path, spark_server) -> Path:
    """config/example.toml as shipped, with the spool, output, runtime dirs and metrics
    port moved into the test's dir and Spark the suite's server (``remote``)."""
    text = (REPO / "config" / "example.toml").read_text()
    text = text.replace('path = "var/spool"', f"path = {json.dumps(str(spool))}")
    text = text.replace('output = "var/orders"', f"output = {json.dumps(str(out))}")
    text = text.replace('listen = "127.0.0.1:9464"', 'listen = ""')
    text = text.replace('dir = "var/run"', f"dir = {json.dumps(str(short_tmp / 'run'))}")
    text = text.replace('state_dir = "var/state"',
                        f"state_dir = {json.dumps(str(short_tmp / 'state'))}")
    text = text.replace("[spark]\n", f"[spark]\nremote = {json.dumps(spark_server.remote)}\n"
                                      f"token_env = {json.dumps(TOKEN_ENV)}\n")
    assert str(short_tmp) in text and str(out) in text and str(spool) in text
    config = short_tmp / "example.toml"
    config.write_text(text)
    return config


def test_the_readme_job_twice_adds_rows_to_the_same_dataset(short_tmp: Path, spark_server,
                                                            spark) -> None:
    """config/example.toml as shipped (the spool, output, runtime dirs and metrics port
    moved into the test's dir; Spark the suite's server): the run prints where the
    dataset is and how many rows it wrote; a second run on new input appends to the same
    dataset, same columns, no new directory.  The second input's prices are whole
    numbers (``total`` comes out an int): the dataset keeps one type per column, the one
    its first commit fixed, and Spark reads it whole; timestamps are Parquet TIMESTAMP,
    not the legacy INT96."""
    import tomllib

    spool = short_tmp / "spool"
    spool.mkdir()
    lines = (REPO / "examples" / "spool" / "orders-0000.jsonl").read_text().splitlines()
    (spool / "a.jsonl").write_text("\n".join(lines[:1500]) + "\n")
    raw = tomllib.loads((REPO / "config" / "example.toml").read_text())
    out = short_tmp / "orders"
    assert raw["spark"]["output"] == "var/orders"
    config = example_config(short_tmp, spool, out, spark_server)
    env = daemon_env(spark_server)

    wrote = re.compile(rf"^orders: wrote (\d+) rows to {re.escape(str(out))}/spark \(parquet\)$",
                       re.M)
    first = run(config, env)
    assert first.returncode == 0, first.stderr[-3000:]
    n1 = int(wrote.search(first.stdout)[1])
    before = pq.read_table(out / "spark")
    # every line of examples/spool is an order (a bad line would fail alone, in handle_failed)
    assert n1 == before.num_rows >= 1490
    layout = sorted(p.name for p in (out / "spark").iterdir() if p.is_dir())

    whole = []
    for line in lines[1500:2500]:
        try:
            order = json.loads(line)
        except ValueError:
            whole.append(line)
            continue
        if isinstance(order, dict) and "unit_price" in order:
            order["unit_price"] = int(order["unit_price"]) + 1
        whole.append(json.dumps(order))
    # every committed row was acknowledged: the journal says so, and the next start puts
    # nothing in doubt (nor says it does)
    journal = short_tmp / "state" / "spark-commits" / "orders.spark"
    assert journal.read_text().split()[-1] == "clean"
    (spool / "b.jsonl").write_text("\n".join(whole) + "\n")
    second = run(config, env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "in doubt" not in second.stderr, second.stderr[-3000:]
    assert journal.read_text().split()[-1] == "clean"
    n2 = int(wrote.search(second.stdout)[1])
    after = pq.read_table(out / "spark")
    assert after.num_rows == n1 + n2 and n2 >= 990
    assert after.schema.names == before.schema.names
    assert set(after.schema.names) == {"order", "sku", "qty", "unit_price", "total",
                                       "message_id", "ingested_at"}
    assert sorted(p.name for p in (out / "spark").iterdir() if p.is_dir()) == layout
    orders = after.column("order").to_pylist()
    assert len(set(orders)) == len(orders) and max(orders) == 2499
    # one type per column, every file (pq.read_table above would have failed otherwise)
    for name in ("unit_price", "total"):
        assert after.schema.field(name).type == pa.float64(), after.schema
    files = list((out / "spark").rglob("*.parquet"))
    assert {pq.read_schema(f).field("total").type for f in files} == {pa.float64()}
    stamp = pq.ParquetFile(files[0]).schema.column(
        pq.read_schema(files[0]).get_field_index("ingested_at"))
    assert stamp.physical_type == "INT64" and "Timestamp" in str(stamp.logical_type)
    # and Spark reads it whole
    assert spark.read.parquet(str(out / "spark")).count() == n1 + n2
