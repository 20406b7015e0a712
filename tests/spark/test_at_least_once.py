"""``[spark] exactly_once = false``: plain at-least-once, the committer keeps no journal.

With the switch on (the default) the committer journals each commit's stamp under the
state dir before the job (docs/design-spark.md §5); off, it writes no journal and checks
nothing, and every line still lands once when nothing fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_pipeline import make_config, write_spool
from tests.spark.test_pipeline_spark import (
    TOKEN_ENV,
    assert_each_message_exactly_once,
    daemon_env,
    rows,
    run,
    spark_section,
)

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("once", [True, False])
def test_the_journal_is_kept_only_with_exactly_once(short_tmp: Path, spark_server,
                                                     once: bool) -> None:
    n = 2000
    write_spool(short_tmp / "spool", n, files=2, extra={"route": "default"})
    out = short_tmp / "dataset"
    # the whole run is the drain (the spool is read at once): room for slow Spark jobs
    config = make_config(short_tmp, shutdown_timeout=120.0, batchers={
        "default": {"batch_size": 500, "batch_timeout": 0.5}})
    extra = {} if once else {"exactly_once": False}
    config.write_text(config.read_text() + spark_section(
        out, remote=spark_server.remote, token_env=TOKEN_ENV, commit_rows=1000,
        commit_interval=0.5, **extra))
    proc = run(config, daemon_env(spark_server))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_each_message_exactly_once(rows(out, "default"), n)
    journals = short_tmp / "state" / "spark-commits"
    assert journals.exists() is once
    if once:
        assert (journals / "e2e.default").read_text().split(), "no stamp journaled"
    # off, a committed batch's staged file goes with its job (nobody reads its ids again)
    staged = list((short_tmp / "state" / "spark-staging").rglob("*.parquet"))
    assert once or not staged, staged
    assert not list((short_tmp / "spool").glob("*.jsonl")), "spool not fully acked"
