"""The pipeline's datasets from outside the daemon: a Spark session on its catalog, as a
snippet to paste (``offbroadway spark conf CONFIG``) or running a query
(``offbroadway spark sql CONFIG "SELECT …"``).

Why: with ``[spark] table`` the table lives in the catalog the daemon keeps under its
state dir (a Hive metastore in embedded Derby, the warehouse beside it:
:func:`.wiring.catalog_conf`), and a plain ``SparkSession`` without those settings says
``[TABLE_OR_VIEW_NOT_FOUND]``.  :func:`session_plan` is the one description of the session
that sees the output: ``spark verify`` and ``spark sql`` open it (:func:`open_session`) and
``spark conf`` prints it as PySpark code, so the three cannot disagree.  A token is never
printed: the snippet reads it where the config says it is.

Embedded Derby admits one JVM: against a local catalog, query while the daemon is stopped
(a ``remote`` Spark, or a dataset path, has no such limit).  pyspark is imported only when
a session is opened.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from ..config.records import Config

#: what the session is set to besides the catalog: bound to loopback (the hostname resolves
#: elsewhere on some machines), no UI, and timestamps shown in UTC as the daemon wrote them
LOCAL_CONF = {"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1",
              "spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC"}


@dataclass(frozen=True)
class SessionPlan:
    """How to open a Spark session that sees a pipeline's output."""

    master: str = ""                     # a local/classic session's master
    conf: dict[str, str] = field(default_factory=dict)
    hive: bool = False                   # enableHiveSupport (a [spark] table)
    remote: str = ""                     # sc://…: a Connect session instead
    token_file: str = ""
    token_env: str = ""
    #: batcher key -> ("table", name) or (format, path): each batcher's output
    datasets: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: ``schema = "evolve"``: a dataset's files differ in columns, read with mergeSchema
    merge: bool = False


def session_plan(config: Config) -> SessionPlan:
    spark = config.spark
    assert spark is not None
    datasets = {key: ("table", spark.table.replace("{batcher}", key)) if spark.table else
                (spark.format, f"{spark.output}/{key}") for key in config.batchers}
    if spark.remote:
        from offbroadway.stages.spark.spark_remote import normalize_remote

        return SessionPlan(remote=normalize_remote(spark.remote), token_file=spark.token_file,
                           token_env=spark.token_env, datasets=datasets, merge=spark.evolve)
    from .wiring import catalog_conf

    return SessionPlan(master=spark.master,
                       conf={**LOCAL_CONF, **catalog_conf(spark, config.runtime.state_dir)},
                       hive=bool(spark.table), datasets=datasets, merge=spark.evolve)


def open_session(config: Config) -> Any:
    """A Spark session that sees the output (a classic local one, or Connect)."""
    plan = session_plan(config)
    if plan.remote:
        from offbroadway.stages.spark import spark_remote
        from pyspark.sql.connect.client import DefaultChannelBuilder
        from pyspark.sql.connect.session import SparkSession as Connect

        builder = DefaultChannelBuilder(plan.remote)
        token = spark_remote.token(plan.token_file or None, plan.token_env or None)
        if token:
            builder.set(DefaultChannelBuilder.PARAM_TOKEN, token)
        return Connect.builder.channelBuilder(builder).create()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = SparkSession.builder.master(plan.master)
    for key, value in plan.conf.items():
        session = session.config(key, value)
    if plan.hive:
        session = session.enableHiveSupport()
    opened = session.getOrCreate()
    opened.sparkContext.setLogLevel("ERROR")
    return opened


def read(session: Any, dataset: tuple[str, str], merge: bool = False) -> Any:
    """One batcher's output as a DataFrame (``merge``: every file's columns)."""
    kind, where = dataset
    if kind == "table":
        return session.table(where)
    reader = session.read.format(kind)
    return (reader.option("mergeSchema", "true") if merge else reader).load(where)


def snippet(config: Config) -> str:
    """PySpark code that opens the session and reads each batcher's output."""
    plan = session_plan(config)
    lines = ["import os", ""]
    if plan.remote:
        lines += ["from pyspark.sql.connect.client import DefaultChannelBuilder",
                  "from pyspark.sql.connect.session import SparkSession", "",
                  f"channel = DefaultChannelBuilder({plan.remote!r})"]
        if plan.token_file:
            lines.append(f"channel.set(DefaultChannelBuilder.PARAM_TOKEN, "
                         f"open({plan.token_file!r}).read().strip())")
        elif plan.token_env:
            lines.append(f"channel.set(DefaultChannelBuilder.PARAM_TOKEN, "
                         f"os.environ[{plan.token_env!r}])")
        lines.append("spark = SparkSession.builder.channelBuilder(channel).create()")
    else:
        lines += ["from pyspark.sql import SparkSession", "",
                  'os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")',
                  "spark = (SparkSession.builder",
                  f"         .master({plan.master!r})"]
        lines += [f"         .config({k!r}, {v!r})" for k, v in plan.conf.items()]
        if plan.hive:
            lines.append("         .enableHiveSupport()")
        lines.append("         .getOrCreate())")
    lines.append("")
    for key, (kind, where) in plan.datasets.items():
        merged = '.option("mergeSchema", "true")' if plan.merge else ""
        read_it = (f"spark.table({where!r})" if kind == "table" else
                   f"spark.read.format({kind!r}){merged}.load({where!r})")
        lines.append(f"{_identifier(key)} = {read_it}   # batcher {key!r}")
    return "\n".join(lines)


def _identifier(key: str) -> str:
    """``df_<key>``: never ``spark`` itself (a batcher is often named so)."""
    return "df_" + "".join(c if c.isalnum() or c == "_" else "_" for c in key)


def run_sql(config: Config, query: str, *, limit: int = 20, as_json: bool = False) -> int:
    """Run ``query`` with each batcher's output registered as a view named by its key
    (with ``table``, the table is there by its own name too); print up to ``limit`` rows
    (a table, or JSON Lines).  0, or 1 with one line when Spark refuses the query."""
    plan = session_plan(config)
    session = open_session(config)
    try:
        for key, dataset in plan.datasets.items():
            if dataset == ("table", key):
                continue      # the table is already there by that name
            try:
                read(session, dataset, plan.merge).createOrReplaceTempView(key)
            except Exception as exc:   # no dataset yet: the view is missing, said once
                print(f"offbroadway: spark: {key}: not registered: {_one_line(exc)}",
                      file=sys.stderr)
        try:
            df = session.sql(query)
            if as_json:
                for row in df.limit(limit).collect():
                    print(json.dumps(row.asDict(recursive=True), default=str))
            else:
                df.show(limit, truncate=False)
        except Exception as exc:
            print(f"offbroadway: spark sql: {_one_line(exc)}", file=sys.stderr)
            return 1
    finally:
        session.stop()
    return 0


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:400]
