"""A Spark Connect session's operations, watched from the server's side.

``python session_ops_proc.py`` with the server's remote and token in the environment
(:func:`offbroadway.stages.spark.spark_remote.handover`'s), run in the server's network
namespace (tests/spark/netns.py), so no broken link stands between it and the server.
Prints ``ready`` once pyspark is loaded, reads a session id from stdin, then asks the
server for that session's operations (Spark Connect's ``GetStatus``) every 20 ms and
prints one JSON line per answer: ``{"t": <epoch seconds asked>, "ops": {operation id:
state}}`` (``{"t": …, "error": …}`` when the call fails).  Asks, never interrupts.
"""

from __future__ import annotations

import json
import os
import sys
import time

from offbroadway.stages.spark import spark_remote
from pyspark.sql.connect.client import DefaultChannelBuilder, SparkConnectClient
from pyspark.sql.connect.client.retries import DefaultPolicy
from pyspark.sql.connect.proto import base_pb2


def main() -> int:
    states = base_pb2.GetStatusResponse.OperationStatus.OperationState
    print("ready", flush=True)
    session = sys.stdin.readline().strip()
    builder = DefaultChannelBuilder(spark_remote.normalize_remote(
        os.environ[spark_remote.ENV_REMOTE]))
    builder.set(DefaultChannelBuilder.PARAM_TOKEN, spark_remote.token())
    builder.set(DefaultChannelBuilder.PARAM_SESSION_ID, session)
    client = SparkConnectClient(connection=builder)
    client.set_retry_policies([DefaultPolicy(max_retries=0)])
    while True:
        t = time.time()
        try:
            got = client._get_operation_statuses()
            line = {"t": t, "ops": {o.operation_id: states.Name(o.state)
                                    for o in got.operation_statuses}}
        except Exception as exc:   # reported, asked again
            line = {"t": t, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        print(json.dumps(line), flush=True)
        time.sleep(0.02)


if __name__ == "__main__":
    sys.exit(main())
