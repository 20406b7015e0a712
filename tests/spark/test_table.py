"""``[spark] table``: the rows land in a table of Spark's catalog, found by name later.

The daemon starts its own Spark server (its catalog kept under the state dir), runs the
spool to idle, and exits; then ``offbroadway spark verify`` opens *another* Spark session
on the same catalog, reads the table by name and counts it: every line once.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, offbroadway_cmd, test_env
from tests.e2e.test_pipeline import make_config, write_spool
from tests.spark.test_pipeline_spark import run

pytestmark = pytest.mark.spark


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
    verify = subprocess.run(offbroadway_cmd("spark", "verify", str(config)), cwd=REPO,
                            env=test_env(), capture_output=True, text=True, timeout=600)
    assert verify.returncode == 0, verify.stderr[-3000:]
    found = re.search(r"table e2e_orders: (\d+) rows, (\d+) messages, (\d+) duplicate rows, "
                      r"(\d+) commits", verify.stdout)
    assert found, verify.stdout + verify.stderr[-2000:]
    rows, ids, dups, commits = map(int, found.groups())
    assert (rows, ids, dups) == (n, n, 0) and commits >= 1


def test_a_table_needs_no_output_and_one_name_per_batcher(tmp_path: Path) -> None:
    """``check``'s side: ``table`` stands in for ``output``; several batchers need
    ``{batcher}`` in the name (one table each), said in one line naming the key."""
    from offbroadway.daemon.config import ConfigError, load_config

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
