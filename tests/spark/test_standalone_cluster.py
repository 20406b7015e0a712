"""Scale out: the same config pointed at a Spark standalone cluster.  A master and one
worker are started from the pip package on 127.0.0.1, the daemon's Connect server runs
with ``master = "spark://…"``, and the rows land."""

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
