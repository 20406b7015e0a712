"""An output only Spark can see: the daemon's processes never touch the dataset.

The Spark Connect server runs in a mount namespace of its own with a private tmpfs
mounted at the output path (``unshare -m`` + ``mount -t tmpfs``; needs root), the way a
cluster's storage (S3, HDFS) is visible to Spark's executors and not to the daemon's
machine.  The staging area (under the daemon's state dir) is shared; the output is not.
The pipeline must still write every line exactly once, which the test proves by reading
the dataset back *through that server*, and the daemon's own view of the output path
must stay empty.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from offbroadway.daemon.spark.wiring import plan
from offbroadway.supervision.child import NOTIFY_FD_ENV

from tests.conftest import test_env
from tests.e2e.test_pipeline import make_config, write_spool
from tests.spark.conftest import ServerHandle, spark_config, wait_ready
from tests.spark.test_pipeline_spark import TOKEN_ENV, daemon_env, run, spark_section

# its own Spark server in its own mount namespace: long: not in the default run (pytest -m slow)
pytestmark = [pytest.mark.slow, pytest.mark.spark,
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                 reason="needs root and unshare(1) for a mount namespace")]


def server_behind_a_private_mount(root: Path, hidden: Path) -> ServerHandle:
    """The daemon's Spark server (its argv and env from ``plan``), started inside a new
    mount namespace where ``hidden`` is a fresh tmpfs nobody else sees."""
    root.mkdir(parents=True, exist_ok=True)
    p = plan(spark_config(root), runtime_dir=str(root), state_dir=str(root / "state"))
    assert p.child is not None
    child_env = dict(p.child.env())  # type: ignore[operator]
    r, w = os.pipe()
    env = {**test_env(), **child_env, NOTIFY_FD_ENV: str(w)}
    argv = " ".join(shlex.quote(a) for a in p.child.argv)
    script = (f"mount -t tmpfs -o size=512m ob-private {shlex.quote(str(hidden))} "
              f"&& exec {argv}")
    out = root / "server.out"
    with open(out, "wb") as fh:
        proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private",
                                 "sh", "-c", script], env=env, pass_fds=(w,), stdout=fh,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    os.close(w)
    bp_env = p.committer_env()
    handle = ServerHandle(proc=proc, dir=Path(child_env["OFFBROADWAY_SPARK_DIR"]), out=out,
                          token=child_env["OFFBROADWAY_SPARK_TOKEN"],
                          remote=bp_env["OFFBROADWAY_SPARK_REMOTE"], bp_env=bp_env)
    try:
        wait_ready(handle, r)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return handle


def test_an_output_only_spark_sees_gets_every_line_exactly_once(short_tmp: Path) -> None:
    n = 5000
    hidden = short_tmp / "hidden"
    hidden.mkdir()
    server = server_behind_a_private_mount(short_tmp / "server", hidden)
    try:
        write_spool(short_tmp / "spool", n, files=2, extra={"route": "spark"})
        config = make_config(short_tmp, shutdown_timeout=60.0, batchers={
            "spark": {"batch_size": 500, "batch_timeout": 0.5, "concurrency": 2}})
        config.write_text(config.read_text() + spark_section(
            hidden, remote=server.remote, token_env=TOKEN_ENV, commit_rows=2000,
            commit_interval=0.5))
        proc = run(config, daemon_env(server))
        assert proc.returncode == 0, proc.stderr[-8000:]
        assert f"wrote {n} rows to {hidden}/spark" in proc.stdout, proc.stdout[-2000:]
        # the daemon's side of the mount: nothing was ever written here
        assert list(hidden.iterdir()) == []
        # Spark's side: every line exactly once
        from pyspark.sql.connect.client import DefaultChannelBuilder
        from pyspark.sql.connect.session import SparkSession

        builder = DefaultChannelBuilder(server.remote)
        builder.set("token", server.token)
        spark = SparkSession.builder.channelBuilder(builder).create()
        try:
            df = spark.read.parquet(f"{hidden}/spark")
            got = df.selectExpr("count(*) AS n", "count(DISTINCT message_id) AS ids",
                                "count(DISTINCT seq) AS seqs").first()
            assert (got.n, got.ids, got.seqs) == (n, n, n)
        finally:
            spark.stop()
    finally:
        server.stop()
