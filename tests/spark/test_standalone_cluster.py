"""Scale out: the same config pointed at a Spark standalone cluster.  A master and one
worker are started from the pip package on 127.0.0.1, the daemon's Connect server runs
with ``master = "spark://…"``, and the rows land; an executor SIGKILLed while a job runs
on it: Spark retries its tasks on the executor the worker starts again, every line once."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, free_port, offbroadway_cmd, test_env, wait_until
from tests.e2e.test_pipeline import make_config, write_spool
from tests.spark.test_pipeline_spark import spark_section

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def answers(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_rows_land_through_a_standalone_cluster(short_tmp: Path) -> None:
    import pyspark

    home = Path(pyspark.__file__).parent
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_LOG_DIR": str(short_tmp / "logs"), "SPARK_WORKER_DIR": str(short_tmp / "work")}
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    spark_class = str(home / "bin" / "spark-class")
    logs = open(short_tmp / "cluster.log", "w")
    master = subprocess.Popen([spark_class, "org.apache.spark.deploy.master.Master",
                               "--host", "127.0.0.1", "--port", str(port), "--webui-port", "0"],
                              env=env, stdout=logs, stderr=subprocess.STDOUT,
                              start_new_session=True)
    worker = None
    try:
        wait_until(lambda: answers(port), timeout=180, message="the standalone master")
        worker = subprocess.Popen([spark_class, "org.apache.spark.deploy.worker.Worker",
                                   master_url, "--host", "127.0.0.1", "--webui-port", "0",
                                   "--cores", "1", "--memory", "1g"],
                                  env=env, stdout=logs, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        n = 3000
        write_spool(short_tmp / "spool", n, files=1)
        out = short_tmp / "dataset"
        config = make_config(short_tmp, batchers={
            "even": {"batch_size": 1000, "batch_timeout": 0.5},
            "odd": {"batch_size": 1000, "batch_timeout": 0.5}})
        config.write_text(config.read_text() + spark_section(out, master=master_url))
        proc = subprocess.run(offbroadway_cmd("run", str(config), "--until-idle"), cwd=REPO,
                              env=test_env(), capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        seqs = sorted(r["seq"] for b in ("even", "odd")
                      for r in pq.read_table(out / b).to_pylist())
        assert seqs == list(range(n))
        assert "app-" in (short_tmp / "cluster.log").read_text() or any(
            (short_tmp / "work").glob("app-*")), "the job did not run on the cluster's worker"
    finally:
        for p in (worker, master):
            if p is not None:
                os.killpg(p.pid, 9)
                p.wait()
        logs.close()


def executors() -> list:
    """The standalone executors' processes (their worker starts them)."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any("CoarseGrainedExecutorBackend" in a for a in p.info["cmdline"] or ()):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def test_an_executor_killed_mid_job_has_its_tasks_retried_and_writes_each_line_once(
        short_tmp: Path) -> None:
    import pyspark

    from tests.spark.test_pipeline_spark import (
        assert_each_message_exactly_once,
        committing,
        rows,
    )

    home = Path(pyspark.__file__).parent
    env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
           "SPARK_LOG_DIR": str(short_tmp / "logs"), "SPARK_WORKER_DIR": str(short_tmp / "work")}
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    spark_class = str(home / "bin" / "spark-class")
    logs = open(short_tmp / "cluster.log", "w")
    master = subprocess.Popen([spark_class, "org.apache.spark.deploy.master.Master",
                               "--host", "127.0.0.1", "--port", str(port), "--webui-port", "0"],
                              env=env, stdout=logs, stderr=subprocess.STDOUT,
                              start_new_session=True)
    worker = daemon = None
    before = {p.pid for p in executors()}
    try:
        wait_until(lambda: answers(port), timeout=180, message="the standalone master")
        worker = subprocess.Popen([spark_class, "org.apache.spark.deploy.worker.Worker",
                                   master_url, "--host", "127.0.0.1", "--webui-port", "0",
                                   "--cores", "1", "--memory", "1g"],
                                  env=env, stdout=logs, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        n = 60_000
        write_spool(short_tmp / "spool", n, files=3, extra={"route": "even"})
        out = short_tmp / "dataset"
        config = make_config(short_tmp, shutdown_timeout=120.0, batchers={
            "even": {"batch_size": 2000, "batch_timeout": 0.5, "concurrency": 2}})
        config.write_text(config.read_text() + spark_section(
            out, master=master_url, commit_rows=20_000, commit_interval=1.0))
        log = short_tmp / "daemon.err"
        with open(log, "w") as err:
            daemon = subprocess.Popen(offbroadway_cmd("run", str(config), "--until-idle"),
                                      cwd=REPO, env=test_env(), stdout=subprocess.DEVNULL,
                                      stderr=err)
        sock = short_tmp / "run" / "control.sock"
        wait_until(lambda: committing(sock, "committer_even"), timeout=600, interval=0.05,
                   message="the committer in a job on the cluster")
        ours = [p for p in executors() if p.pid not in before]
        assert ours, "no executor of the cluster's"
        for p in ours:
            p.kill()
        code = daemon.wait(900)
        assert code == 0, log.read_text()[-3000:]
        assert_each_message_exactly_once(rows(out, "even"), n)
        assert not list((short_tmp / "spool").glob("*.jsonl")), "lines left unacked"
        # the worker started another executor for the application
        assert [p for p in executors() if p.pid not in before | {q.pid for q in ours}] or \
            "Executor app-" in (short_tmp / "cluster.log").read_text() or \
            len(list((short_tmp / "work").glob("app-*/*"))) > 1, "no executor started again"
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        for p in (worker, master):
            if p is not None:
                os.killpg(p.pid, 9)
                p.wait()
        logs.close()
