"""Run as ``python -m tests.faults.metrics_child DIR N``: forks N stage-like processes one
after another, each publishing known counts through the stages' real metrics code
(:class:`offbroadway.stages.runtime.metrics.StageMetrics`) and exiting; prints each child's pid
once it has been reaped, so the test can tell the daemon's compaction about it, and
forks the next one only when the test answers with a line: in lockstep, as the daemon
compacts a stage's files before its supervisor starts the next incarnation (without it,
a slow test fell behind and saw the files of several dead children at once)."""

from __future__ import annotations

import os
import sys


def child(i: int) -> None:
    from offbroadway.stages.runtime.metrics import StageMetrics

    m = StageMetrics("p", f"processor_default_{i % 3}", "processor")
    for _ in range(i % 5 + 1):            # i % 5 + 1 observations of batch_size i
        m.observe("batch_size", float(i))
    m.flush({"in": i + 1, "out": i, "failed": 2 * i}, {"demand": 7, "buffered": i})
    os._exit(0)


def main() -> None:
    path, n = sys.argv[1], int(sys.argv[2])
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    import offbroadway.stages.runtime.metrics  # noqa: F401  (imported once, before the forks)
    import prometheus_client  # noqa: F401
    for i in range(n):
        pid = os.fork()
        if pid == 0:
            child(i)
        os.waitpid(pid, 0)
        print(pid, flush=True)
        if not sys.stdin.readline():        # the test is gone
            return


if __name__ == "__main__":
    main()
