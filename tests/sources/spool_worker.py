"""A stand-in producer process for the spool crash tests: it uses the real spool source in
its own process, so the tests can SIGKILL it at a point of their choosing.

    python spool_worker.py '<json job>'

The job names ``path``, ``state``, optional ``index``/``count`` (producer index and count)
and a ``mode``:

* ``drain``: fetch everything, settle nothing, print one JSON list of
  ``[file, line, data, error]`` and exit.  This is "a fresh source after a restart".
* ``settle``: fetch everything, ack the ``[file, line]`` pairs in ``ack``, fail those in
  ``fail`` (reason ``"boom"``), print ``SETTLED``, then block until killed.
* ``stream``: fetch everything, shuffle with ``seed`` into frames of ``frame`` lines and
  ack frame after frame, printing ``ACKED <k>`` once ``ack()`` for frame k has returned;
  print ``DONE`` at the end and block until killed.
"""

from __future__ import annotations

import json
import random
import sys

from offbroadway.stages.sources import get_source
from offbroadway.stages.sources.base import failure_of


def main() -> None:
    job = json.loads(sys.argv[1])
    src = get_source("spool")({"path": job["path"], "scan_interval": 0},
                              pipeline="crash-test", producer_index=job.get("index", 0),
                              producer_count=job.get("count", 1), state_dir=job["state"])
    src.open()
    items = []
    while True:
        got = src.fetch(1000)
        if not got:
            break
        items.extend(got)
    mode = job["mode"]
    if mode == "drain":
        out = [[it[2]["file"], it[2]["line"], it[1], failure_of(it)] for it in items]
        print(json.dumps(out), flush=True)
        src.close()
        return
    handles = {(meta["file"], meta["line"]): h for _, _, meta, h in items}
    if mode == "settle":
        src.ack([handles[tuple(k)] for k in job.get("ack", [])])
        src.fail([(handles[tuple(k)], "boom") for k in job.get("fail", [])])
        print("SETTLED", flush=True)
    elif mode == "stream":
        order = sorted(handles)
        random.Random(job["seed"]).shuffle(order)
        size = job["frame"]
        for k in range((len(order) + size - 1) // size):
            src.ack([handles[key] for key in order[k * size:(k + 1) * size]])
            print(f"ACKED {k}", flush=True)
        print("DONE", flush=True)
    sys.stdin.read()                  # the test kills us here (or mid-stream)


if __name__ == "__main__":
    main()
