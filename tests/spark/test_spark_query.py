"""The table in one line: ``offbroadway spark sql`` and a plain PySpark session built from
``offbroadway spark conf`` read a ``[spark] table`` back by name (a session without the
catalog's settings says TABLE_OR_VIEW_NOT_FOUND), and ``spark verify`` prints the schema."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from offbroadway.daemon.config.load import validate
from offbroadway.daemon.spark.query import snippet

from tests.conftest import REPO, offbroadway_cmd, test_env
from tests.e2e.test_pipeline import make_config, write_spool
from tests.spark.test_pipeline_spark import run

pytestmark = pytest.mark.spark


def _config(tmp: Path, **spark: object) -> object:
    return validate({"pipeline": {"name": "p", "handler": "examples.orders:Orders"},
                     "producer": {"source": "spool", "options": {"path": str(tmp)}},
                     "batchers": {"spark": {"batch_size": 10}},
                     "spark": spark,
                     "runtime": {"dir": str(tmp / "run"), "state_dir": str(tmp / "state")}}
                    ).config


def test_the_snippet_opens_the_pipelines_catalog(tmp_path: Path) -> None:
    code = snippet(_config(tmp_path, table="orders"))
    compile(code, "snippet", "exec")
    assert '.enableHiveSupport()' in code and "df_spark = spark.table('orders')" in code
    assert f"databaseName={tmp_path / 'state' / 'spark-metastore'};create=true" in code
    assert f"{tmp_path / 'state' / 'spark-warehouse'}" in code
    code = snippet(_config(tmp_path, output=str(tmp_path / "out")))
    assert f"spark.read.format('parquet').load('{tmp_path / 'out'}/spark')" in code
    code = snippet(_config(tmp_path, output="o", remote="sc://127.0.0.1:15002",
                           token_env="MY_TOKEN"))
    assert "DefaultChannelBuilder('sc://localhost:15002')" in code
    assert "os.environ['MY_TOKEN']" in code


# the daemon's own Spark server with a catalog, then two JVMs more: long (pytest -m slow)
@pytest.mark.slow
def test_a_table_read_back_by_spark_sql_and_by_the_conf_snippet(short_tmp: Path) -> None:
    n = 300
    write_spool(short_tmp / "spool", n, files=1, extra={"route": "spark"})
    config = make_config(short_tmp, batchers={"spark": {"batch_size": 100,
                                                        "batch_timeout": 0.5}})
    config.write_text(config.read_text() + '\n[spark]\ntable = "e2e_orders"\n'
                      'master = "local[1]"\ncommit_interval = 0.5\n')
    proc = run(config, test_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]

    sql = subprocess.run(offbroadway_cmd("spark", "sql", str(config), "--json",
                                         "SELECT count(*) AS n, count(DISTINCT seq) AS seqs "
                                         "FROM e2e_orders"),
                         cwd=REPO, env=test_env(), capture_output=True, text=True, timeout=600)
    assert sql.returncode == 0, sql.stderr[-3000:]
    assert json.loads(sql.stdout.strip().splitlines()[-1]) == {"n": n, "seqs": n}

    # the batcher's key is a view of the table too
    sql = subprocess.run(offbroadway_cmd("spark", "sql", str(config), "--json",
                                         "SELECT max(seq) AS top FROM spark"),
                         cwd=REPO, env=test_env(), capture_output=True, text=True, timeout=600)
    assert sql.returncode == 0 and json.loads(sql.stdout.strip().splitlines()[-1]) == \
        {"top": n - 1}, sql.stderr[-3000:]

    conf = subprocess.run(offbroadway_cmd("spark", "conf", str(config)), cwd=REPO,
                          env=test_env(), capture_output=True, text=True, timeout=120)
    assert conf.returncode == 0, conf.stderr
    plain = subprocess.run([sys.executable, "-c", conf.stdout +
                            "\nprint('rows', spark.table('e2e_orders').count())\nspark.stop()"],
                           cwd=short_tmp, env=test_env(), capture_output=True, text=True,
                           timeout=600)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert f"rows {n}" in plain.stdout

    verify = subprocess.run(offbroadway_cmd("spark", "verify", str(config)), cwd=REPO,
                            env=test_env(), capture_output=True, text=True, timeout=600)
    assert verify.returncode == 0, verify.stderr[-3000:]
    assert "  schema: seq bigint, route string, key bigint" in verify.stdout, verify.stdout
    assert "message_id string, ingested_at timestamp" in verify.stdout
