"""``[spark] table``: the rows land in a table of Spark's catalog, found by name later.

The daemon starts its own Spark server (its catalog kept under the state dir), runs the
spool to idle, and exits; then ``offbroadway spark verify`` opens *another* Spark session
(a process and a JVM of its own) on the same catalog, reads the table by name and counts
its rows and distinct ``message_id``s: every line once.  The same after a SIGKILL during
a commit of a batch processor, the committer, the Spark JVM, or the whole process group
followed by a rerun.
"""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, offbroadway_cmd, test_env, wait_until
from tests.e2e.test_pipeline import make_config, stage_pids, write_spool
from tests.spark.test_pipeline_spark import (
    JVM,
    committing,
    kill_the_daemon_alone,
    kill_the_process_group,
    run,
    sigkill_a_stage,
    start_logged,
    the_jvm,
)

pytestmark = pytest.mark.spark


def counted_by_another_session(config: Path) -> tuple[int, int, int, int]:
    """``offbroadway spark verify``: a classic Spark session in a process of its own on
    the daemon's catalog (the daemon has stopped: Derby admits one JVM) reads the table by
    name; (rows, distinct message ids, duplicate rows, commits)."""
    verify = subprocess.run(offbroadway_cmd("spark", "verify", str(config)), cwd=REPO,
                            env=test_env(), capture_output=True, text=True, timeout=600)
    found = re.search(r"table e2e_orders: (\d+) rows, (\d+) messages, (\d+) duplicate rows, "
                      r"(\d+) commits", verify.stdout)
    assert found, verify.stdout + verify.stderr[-2000:]
    counts = tuple(map(int, found.groups()))
    assert verify.returncode == (1 if counts[2] else 0), verify.stderr[-3000:]
    return counts   # type: ignore[return-value]


# its own Spark server with a catalog: long: not in the default run (pytest -m slow)
@pytest.mark.slow
def test_a_table_by_name_holds_every_line_once(short_tmp: Path) -> None:
    n = 3000
    write_spool(short_tmp / "spool", n, files=2, extra={"route": "spark"})
    config = make_config(short_tmp, shutdown_timeout=60.0, batchers={
        "spark": {"batch_size": 500, "batch_timeout": 0.5, "concurrency": 2}})
    config.write_text(config.read_text() + '\n[spark]\ntable = "e2e_orders"\n'
                      'master = "local[1]"\ncommit_rows = 1000\ncommit_interval = 0.5\n')
    proc = run(config, test_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert f"wrote {n} rows to table e2e_orders" in proc.stdout, proc.stdout[-2000:]
    assert (short_tmp / "state" / "spark-warehouse" / "e2e_orders").is_dir()
    # another session, the same catalog, the table by name
    rows, ids, dups, commits = counted_by_another_session(config)
    assert (rows, ids, dups) == (n, n, 0) and commits >= 1


def test_a_table_needs_no_output_and_one_name_per_batcher(tmp_path: Path) -> None:
    """``check``'s side: ``table`` stands in for ``output``; several batchers need
    ``{batcher}`` in the name (one table each), said in one line naming the key."""
    from offbroadway.daemon.config.load import ConfigError, load_config

    write_spool(tmp_path / "spool", 1)
    config = make_config(tmp_path, batchers={"a": {"batch_size": 10}})
    config.write_text(config.read_text() + '\n[spark]\ntable = "db.orders"\n')
    spark = load_config(str(config)).config.spark
    assert spark is not None and spark.table == "db.orders" and spark.output == ""
    two = make_config(tmp_path, batchers={"a": {"batch_size": 10}, "b": {"batch_size": 10}})
    two.write_text(two.read_text() + '\n[spark]\ntable = "orders"\n')
    with pytest.raises(ConfigError, match=r"spark\.table: .*\{batcher\}"):
        load_config(str(two))
    two.write_text(two.read_text().replace('"orders"', '"orders_{batcher}"'))
    assert load_config(str(two)).config.spark.table == "orders_{batcher}"
    two.write_text(two.read_text().replace('"orders_{batcher}"', '"no such; table"'))
    with pytest.raises(ConfigError, match=r"spark\.table"):
        load_config(str(two))


def kill_during_a_commit(tmp: Path, config: Path, kill: str) -> str:
    """Run ``config`` until idle, SIGKILL ``kill`` once the committer runs a Spark job
    (after one committed): a stage by its id, :data:`JVM` (the daemon's Spark server's
    JVM), ``group`` (the daemon's whole process group) or ``daemon`` (the daemon process
    alone: its stages die of it), the last two followed by a rerun until idle.  Returns
    the daemon's log (with the rerun's)."""
    sock = tmp / "run" / "control.sock"

    def in_a_commit() -> dict[str, int]:
        # the daemon starts its JVM first: up to minutes on this shared machine
        wait_until(lambda: committing(sock, "committer_spark"), timeout=400, interval=0.1,
                   message="the committer in a Spark job")
        return stage_pids(sock)

    if kill not in ("group", "daemon"):
        daemon, log = start_logged(config, tmp)
        return sigkill_a_stage(daemon, log, in_a_commit, kill)
    log = tmp / "daemon.err"
    with open(log, "w") as err_file:
        daemon = subprocess.Popen(offbroadway_cmd("run", str(config), "--until-idle"),
                                  cwd=REPO, env=test_env(), stdout=subprocess.DEVNULL,
                                  stderr=err_file, start_new_session=kill == "group")
    try:
        pids = in_a_commit()
        jvm = the_jvm(pids["spark"])
        if kill == "group":
            kill_the_process_group(daemon, pids.values())
        else:
            kill_the_daemon_alone(daemon, pids.values())
        jvm.wait(60)   # the server's JVM dies with its wrapper (PDEATHSIG): Derby's lock
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert daemon.returncode == -signal.SIGKILL
    proc = run(config, test_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return log.read_text() + proc.stderr


# its own Spark server with a catalog, then another session's JVM: long (pytest -m slow)
@pytest.mark.slow
@pytest.mark.parametrize("kill", ["batch_processor_spark_0", "committer_spark", JVM, "group",
                                  "producer_0", "daemon"])
def test_a_table_after_a_sigkill_during_a_commit_holds_every_line_once(
        short_tmp: Path, kill: str) -> None:
    """12,000 lines (2 ms each over two processors) into ``[spark] table`` through one
    batcher of two batch processors, 2,000-row commits; ``kill`` SIGKILLed during a
    commit; the pipeline runs until idle.  Another Spark session counts the table by
    name: every line once, nothing lost.  (While the daemon's JVM starts, the stages fill
    with what the batch processors may hold, ~5,000 rows at these sizes, and the first
    job takes it all: with 8,000 lines the rest could be one more job, in the drain, and
    no commit ran while the status was asked.)"""
    n = 12_000
    write_spool(short_tmp / "spool", n, files=3, extra={"route": "spark"})
    config = make_config(short_tmp, context={"slow": 0.002}, shutdown_timeout=60.0, batchers={
        "spark": {"batch_size": 500, "batch_timeout": 0.5, "concurrency": 2}})
    config.write_text(config.read_text() + '\n[spark]\ntable = "e2e_orders"\n'
                      'master = "local[1]"\ncommit_rows = 2000\ncommit_interval = 0.5\n')
    err = kill_during_a_commit(short_tmp, config, kill)
    assert not list((short_tmp / "spool").glob("*.jsonl")), "lines left unacked"
    rows, ids, dups, _commits = counted_by_another_session(config)
    assert (rows, ids, dups) == (n, n, 0), f"{rows} rows, {ids} ids\n{err[-5000:]}"
    # and they are the lines sent: every seq, from the table's own files
    seqs = pq.read_table(short_tmp / "state" / "spark-warehouse" / "e2e_orders",
                         columns=["seq"]).column("seq").to_pylist()
    assert sorted(seqs) == list(range(n))
