"""An earlier committer incarnation whose job outlives it on the server.

``python slow_job_proc.py SESSION_ID DATASET STAMP ROWS MS_PER_ROW`` with the server's
remote and token in the environment: opens the Spark Connect session ``SESSION_ID`` and
appends ``ROWS`` rows (``message_id`` s0…, ``ingested_at`` STAMP) to DATASET in one task
that sleeps ``MS_PER_ROW`` ms a row in the JVM (``java_method``), so the job runs for
seconds.  Unlike the committer's, the job is *reattachable* (pyspark's default): the
server carries on when this client dies, as a cluster that never saw the connection
drop (a partition, a dead host) does.  Prints ``started`` once the job was sent.
"""

from __future__ import annotations

import os
import sys
import threading

from offbroadway.stages.spark import spark_remote
from pyspark.sql.connect.client import DefaultChannelBuilder
from pyspark.sql.connect.session import SparkSession


def main() -> int:
    session_id, dataset, stamp = sys.argv[1:4]
    rows, ms = int(sys.argv[4]), int(sys.argv[5])
    builder = DefaultChannelBuilder(spark_remote.normalize_remote(
        os.environ[spark_remote.ENV_REMOTE]))
    builder.set(DefaultChannelBuilder.PARAM_TOKEN, spark_remote.token())
    builder.set(DefaultChannelBuilder.PARAM_SESSION_ID, session_id)
    spark = SparkSession.builder.channelBuilder(builder).create()
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    # the sleep is part of the id (a void method gives null), so no plan prunes it
    df = spark.range(rows).repartition(1).selectExpr(
        "concat('s', cast(id as string), coalesce(java_method('java.lang.Thread', "
        f"'sleep', cast({ms} as bigint)), '')) as message_id",
        f"timestamp'{stamp}' as ingested_at")
    job = threading.Thread(target=lambda: df.write.mode("append").parquet(dataset))
    job.start()
    print("started", flush=True)
    job.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
