"""A batch processor's Spark side in its own process: write batches for a while.

``python writer_proc.py OUTPUT BATCHER WRITER_ID SECONDS BATCH_SIZE`` with the server's
remote and token in the environment (as the daemon hands them to batch processors).
Prints one JSON line: batches and rows sent, ids that failed, first/last write times.
"""

from __future__ import annotations

import json
import sys
import time

from offbroadway import Message
from offbroadway.stages.spark.spark_sink import SparkSink


def main() -> int:
    output, batcher, writer_id = sys.argv[1:4]
    seconds, batch_size = float(sys.argv[4]), int(sys.argv[5])
    sink = SparkSink(output=output, writer_id=writer_id, write_retry_seconds=30)
    deadline = time.time() + seconds
    sent = 0
    batches = 0
    failed: list[str] = []
    first = last = 0.0
    payload = "p" * 100
    while time.time() < deadline:
        msgs = [Message(f"{writer_id}-{sent + i}", {"seq": sent + i, "payload": payload})
                for i in range(batch_size)]
        t = time.time()
        first = first or t
        sink.write(batcher, msgs)
        last = time.time()
        failed += [m.id for m in msgs if m.status is not None]
        sent += batch_size
        batches += 1
    sink.close()
    print(json.dumps({"writer": writer_id, "rows": sent, "batches": batches, "failed": failed,
                      "first": first, "last": last}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
