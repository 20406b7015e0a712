"""A tiny supervised child for the tests: standard library only, so it starts fast.

    proc.py ID LOG [--mode MODE] [--code N] [--beat SECONDS] [--hog MIB] [--term-delay S]

Appends ``start ID PID`` to LOG before reporting ready and ``stop ID PID`` when SIGTERM
arrives, so a test can read the order in which children really started and stopped.

Modes: ``ok`` (ready, then idle), ``exit-before-ready`` and ``exit-after-ready`` (exit
with --code), ``never-ready``, ``ignore-term`` (ready, SIGTERM ignored), ``hog`` (ready,
then hold --hog MiB).  --beat sends heartbeats at that interval (default: none).
"""

import argparse
import os
import signal
import sys
import time


def log(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("id")
    p.add_argument("log")
    p.add_argument("--mode", default="ok")
    p.add_argument("--code", type=int, default=0)
    p.add_argument("--beat", type=float, default=0.0)
    p.add_argument("--hog", type=int, default=0)
    p.add_argument("--term-delay", type=float, default=0.0)
    a = p.parse_args()
    pid = os.getpid()
    notify = os.environ.get("OFFBROADWAY_NOTIFY_FD")
    fd = int(notify) if notify else None

    def on_term(signum, frame):
        log(a.log, f"stop {a.id} {pid}")
        if a.term_delay:
            time.sleep(a.term_delay)
        os._exit(0)

    signal.signal(signal.SIGTERM,
                  signal.SIG_IGN if a.mode == "ignore-term" else on_term)
    log(a.log, f"start {a.id} {pid}")
    if a.mode == "exit-before-ready":
        return a.code
    if a.mode != "never-ready" and fd is not None:
        os.write(fd, b"R")
    if a.mode == "exit-after-ready":
        return a.code
    hog = b"x" * (a.hog * 2**20) if a.mode == "hog" else b""  # noqa: F841 - held on purpose
    while True:
        if a.beat and fd is not None:
            try:
                os.write(fd, b"H")
            except OSError:
                pass
            time.sleep(a.beat)
        else:
            signal.pause()


if __name__ == "__main__":
    sys.exit(main())
