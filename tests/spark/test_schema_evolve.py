"""``[spark] schema = "evolve"`` with real Spark: run 1 writes fields a, b; run 2's handler
adds c, and its committer is SIGKILLed during a Spark job; Spark reads every row once, c
null for run 1's; a run whose handler changes b's type is refused with one line per
message naming the field and both types.  The same growth for a ``[spark] table``."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
from offbroadway.daemon.core.outcome import EXIT_FAILED

from tests.conftest import REPO, offbroadway_cmd, wait_until
from tests.e2e.test_pipeline import make_config, stage_pids
from tests.spark.test_pipeline_spark import (
    TOKEN_ENV,
    committing,
    daemon_env,
    run,
    sigkill_a_stage,
    spark_section,
    start_logged,
)

pytestmark = pytest.mark.spark


def spool(tmp: Path, first: int, n: int) -> None:
    d = tmp / "spool"
    d.mkdir(exist_ok=True)
    (d / f"part-{first}.jsonl").write_text(
        "".join(json.dumps({"seq": s}) + "\n" for s in range(first, first + n)))


def configured(tmp: Path, server, context: dict, **spark: object) -> Path:
    config = make_config(tmp, handler="tests.spark.evolve_handlers:Evolving",
                         context=context, shutdown_timeout=30.0, batchers={
                             "default": {"batch_size": 300, "batch_timeout": 0.5,
                                         "concurrency": 2}})
    config.write_text(config.read_text() + spark_section(
        tmp / "dataset", remote=server.remote, token_env=TOKEN_ENV, schema="evolve",
        commit_rows=1500, commit_interval=0.5, **spark))
    return config


def read_all(spark, tmp: Path, table: str | None = None) -> list[dict]:
    df = spark.table(table) if table else \
        spark.read.option("mergeSchema", "true").parquet(str(tmp / "dataset" / "default"))
    return [r.asDict() for r in df.select("seq", "a", "b", "c", "message_id").collect()]


@pytest.mark.slow
def test_a_new_field_becomes_a_column_across_a_kill(short_tmp: Path, spark_server,
                                                    spark) -> None:
    spool(short_tmp, 0, 300)
    proc = run(configured(short_tmp, spark_server, {}), daemon_env(spark_server))
    assert proc.returncode == 0, proc.stderr[-4000:]

    n = 6000
    spool(short_tmp, 300, n)
    config = configured(short_tmp, spark_server, {"add_c": True, "slow": 0.002})
    sock = short_tmp / "run" / "control.sock"
    daemon, log = start_logged(config, short_tmp, daemon_env(spark_server))

    def in_a_commit() -> dict[str, int]:
        wait_until(lambda: committing(sock, "committer_default"), timeout=120, interval=0.1,
                   message="the committer in a Spark job")
        return stage_pids(sock)

    err = sigkill_a_stage(daemon, log, in_a_commit, "committer_default")
    found = read_all(spark, short_tmp)
    seqs = sorted(r["seq"] for r in found)
    assert seqs == list(range(300 + n)), (len(seqs), len(set(seqs)), err[-3000:])
    assert len({r["message_id"] for r in found}) == len(found)
    assert all(r["c"] is None for r in found if r["seq"] < 300)
    assert all(r["c"] == r["seq"] * 0.5 for r in found if r["seq"] >= 300)

    # b turns into an int: refused, one line naming the field and both types
    spool(short_tmp, 10_000, 50)
    failed_config = configured(short_tmp, spark_server, {"add_c": True, "b_int": True})
    proc = run(failed_config, daemon_env(spark_server))
    assert proc.returncode == EXIT_FAILED, proc.stderr[-4000:]
    said = [ln for ln in proc.stderr.splitlines() if "cannot be rows" in ln]
    assert said and all("spark: field 'b' does not fit the schema: expected string, got "
                        "int64" in ln for ln in said), proc.stderr[-3000:]
    assert len(read_all(spark, short_tmp)) == 300 + n

    # spark verify reads the dataset whole (mergeSchema) and shows c
    verify = subprocess.run(offbroadway_cmd("spark", "verify", str(config)), cwd=REPO,
                            env=daemon_env(spark_server), capture_output=True, text=True,
                            timeout=300)
    assert verify.returncode == 0, verify.stderr[-3000:]
    assert f"{300 + n} rows, {300 + n} messages, 0 duplicate rows" in verify.stdout
    schema = next(ln for ln in verify.stdout.splitlines() if ln.startswith("  schema: "))
    assert set(schema.removeprefix("  schema: ").split(", ")) == {
        "seq bigint", "a bigint", "b string", "c double", "message_id string",
        "ingested_at timestamp"}, verify.stdout


def test_a_table_grows_a_column(short_tmp: Path, spark_server, spark) -> None:
    table = f"evolve_{uuid.uuid4().hex[:8]}"
    spool(short_tmp, 0, 200)
    proc = run(configured(short_tmp, spark_server, {}, table=table), daemon_env(spark_server))
    assert proc.returncode == 0, proc.stderr[-4000:]
    spool(short_tmp, 200, 200)
    proc = run(configured(short_tmp, spark_server, {"add_c": True}, table=table),
               daemon_env(spark_server))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"added column(s) c to table {table}" in proc.stderr
    found = read_all(spark, short_tmp, table)
    assert sorted(r["seq"] for r in found) == list(range(400))
    assert all((r["c"] is None) == (r["seq"] < 200) for r in found)
    spark.sql(f"DROP TABLE {table}")
