"""``offbroadway spark verify CONFIG``: prove a pipeline's datasets hold each message once.

For every batcher of the config's ``[spark]`` section it reads the dataset back through
Spark (the config's ``remote`` with its token, else a local classic session on the
config's ``master``: the output may be somewhere only Spark sees) and prints one line:

    spark: <dataset>: R rows, M messages, D duplicate rows, C commits
      schema: seq bigint, total double, message_id string, ingested_at timestamp

``messages`` counts distinct ``message_id``s, ``commits`` distinct ``ingested_at`` stamps
(each commit has its own, docs/design-spark.md §5).  Exit 0 when no dataset has a
duplicate, 1 when one has, 2 for a config error (as ``check``).

The session is the one :mod:`.query` describes (``spark sql`` and ``spark conf`` use
it too); pyspark is imported only when the command runs.
"""

from __future__ import annotations

import sys
from typing import Any

from ..config.records import Config
from .query import open_session, read, session_plan


def ddl(schema: Any) -> str:
    """A Spark schema in DDL's words (``seq bigint, tags array<string>, …``), one line: the
    data columns of it are what ``[spark] schema`` takes to pin a dataset's schema."""
    def name(n: str) -> str:
        return n if n.isidentifier() else "`" + n.replace("`", "``") + "`"
    return ", ".join(f"{name(f.name)} {f.dataType.simpleString()}"
                     f"{'' if f.nullable else ' NOT NULL'}" for f in schema.fields)


def verify(config: Config) -> int:
    """Print one line per dataset; 0 if none holds a duplicate, else 1."""
    spark_cfg = config.spark
    if spark_cfg is None:
        print("offbroadway: the config has no [spark] section: nothing to verify",
              file=sys.stderr)
        return 2
    plan = session_plan(config)
    session = open_session(config)
    worst = 0
    try:
        for key in config.batchers:
            kind, where = plan.datasets[key]
            dataset = f"table {where}" if kind == "table" else where
            try:
                df = read(session, plan.datasets[key], plan.merge)
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
            print(f"  schema: {ddl(df.schema)}")
    finally:
        session.stop()
    return worst
