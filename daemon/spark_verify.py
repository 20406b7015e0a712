"""``offbroadway spark verify CONFIG``: prove a pipeline's datasets hold each message once.

For every batcher of the config's ``[spark]`` section it reads the dataset back through
Spark (the config's ``remote`` with its token, else a local classic session on the
config's ``master``: the output may be somewhere only Spark sees) and prints one line:

    spark: <dataset>: R rows, M messages, D duplicate rows, C commits

``messages`` counts distinct ``message_id``s, ``commits`` distinct ``ingested_at`` stamps
(each commit has its own, docs/design-spark.md §5).  Exit 0 when no dataset has a
duplicate, 1 when one has, 2 for a config error (as ``check``).

pyspark is imported here only, when the command runs.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .config import Config


def _session(config: Config) -> Any:
    """A Spark session that sees the output."""
    spark = config.spark
    assert spark is not None
    if spark.remote:
        from offbroadway.stages.spark import spark_remote
        from pyspark.sql.connect.client import DefaultChannelBuilder
        from pyspark.sql.connect.session import SparkSession as Connect

        builder = DefaultChannelBuilder(spark_remote.normalize_remote(spark.remote))
        token = spark_remote.token(spark.token_file or None, spark.token_env or None)
        if token:
            builder.set(DefaultChannelBuilder.PARAM_TOKEN, token)
        return Connect.builder.channelBuilder(builder).create()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from .spark import catalog_conf

    builder = (SparkSession.builder.master(spark.master)
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.ui.enabled", "false"))
    for key, value in catalog_conf(spark, config.runtime.state_dir).items():
        builder = builder.config(key, value)
    if spark.table:
        builder = builder.enableHiveSupport()
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def verify(config: Config) -> int:
    """Print one line per dataset; 0 if none holds a duplicate, else 1."""
    spark_cfg = config.spark
    if spark_cfg is None:
        print("offbroadway: the config has no [spark] section: nothing to verify",
              file=sys.stderr)
        return 2
    session = _session(config)
    worst = 0
    try:
        for key in config.batchers:
            if spark_cfg.table:
                dataset = f"table {spark_cfg.table.replace('{batcher}', key)}"
            else:
                dataset = f"{spark_cfg.output}/{key}"
            try:
                df = session.table(dataset.removeprefix("table ")) if spark_cfg.table \
                    else session.read.format(spark_cfg.format).load(dataset)
            except Exception as exc:   # no dataset yet: say so, it holds nothing twice
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                print(f"spark: {dataset}: nothing to read ({type(exc).__name__}: "
                      f"{first[:200]})")
                continue
            got = df.selectExpr("count(*) AS rows", "count(DISTINCT message_id) AS ids",
                                "count(DISTINCT ingested_at) AS commits").first()
            dups = got["rows"] - got["ids"]
            worst = max(worst, 1 if dups else 0)
            print(f"spark: {dataset}: {got['rows']} rows, {got['ids']} messages, {dups} "
                  f"duplicate rows, {got['commits']} commits")
    finally:
        session.stop()
    return worst
