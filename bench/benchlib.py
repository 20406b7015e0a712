"""What the daemon benchmarks share (throughput.py, stop_latency.py, rabbitmq_vs_pika.py):
a daemon started on a config in a temp dir, its status polled through the control socket,
and the figures read off the status tree, the stages' CPU among them.

Imported by the scripts as ``benchlib`` (a script's folder is first on ``sys.path``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
from offbroadway.daemon.config.names import role_of
from offbroadway.daemon.spark.settings import free_port  # noqa: F401 (re-exported: one definition)
from offbroadway.supervision.tree import snapshot_nodes

REPO = Path(__file__).resolve().parent.parent

#: a handler that does nothing but route every message to the batcher ``sink``
NOOP_HANDLER = '''
from offbroadway import Pipeline

class Noop(Pipeline):
    def handle_message(self, processor, message, context):
        return message.put_batcher("sink")

    def handle_batch(self, batcher, messages, batch_info, context):
        return messages
'''


def sink_and_runtime(tmp: Path, listen: str = "", runtime: str = "") -> str:
    """The end of every benchmark config: one ``sink`` batcher of 100 (one batch processor),
    metrics on ``listen`` ('' for off), runtime and state under ``tmp``, plus ``runtime``
    lines (e.g. ``log_format``)."""
    return f"""
[batchers.sink]
batch_size = 100
batch_timeout = 1.0
concurrency = 1

[metrics]
listen = "{listen}"

[runtime]
dir = "{tmp}/run"
state_dir = "{tmp}/state"
{runtime}"""


def start_daemon(tmp: Path, config: Path, *args: str, stdout: Any = subprocess.PIPE
                 ) -> subprocess.Popen:
    """``offbroadway run CONFIG ARGS`` from ``tmp``, which (and the repository) is on its
    ``PYTHONPATH`` for the handler; stderr is a pipe, text."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp), str(REPO)]))
    return subprocess.Popen([sys.executable, "-m", "offbroadway.daemon.cli", "run",
                             str(config), *args], cwd=tmp, env=env, stdout=stdout,
                            stderr=subprocess.PIPE, text=True)


def wait_alive(what: str, predicate: Callable[[], Any], timeout: float, interval: float,
               proc: subprocess.Popen | None, abort: type[Exception]) -> Any:
    """Poll ``predicate`` until it is truthy and return its value.  A daemon (``proc``)
    that exits meanwhile, or ``timeout`` passing, ends the wait with ``abort``: a bench
    that waits on a dead daemon would only time out, later and saying less."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if proc is None or proc.poll() is not None:
            raise abort(f"the daemon exited with {proc and proc.returncode} while waiting "
                        f"for {what}")
        if time.monotonic() > deadline:
            raise abort(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def status(sock: str) -> dict | None:
    """The daemon's status, or None while it is not up yet or is stopping."""
    from offbroadway.daemon.cli import control

    try:
        return control.request(sock, {"cmd": "status"}, timeout=5)["status"]
    except (control.ControlError, OSError, ValueError):
        return None


def statuses(daemon: subprocess.Popen, sock: str, interval: float) -> Iterator[dict]:
    """The daemon's status every ``interval`` seconds for as long as it runs."""
    while daemon.poll() is None:
        s = status(sock)
        if s is None:
            time.sleep(min(interval, 0.1))
            continue
        yield s
        time.sleep(interval)


# -- the status tree (walked with the supervision library's snapshot walks) --------------------

def producer_acked(tree: dict) -> int:
    """Messages acked at the source, all producers."""
    return sum(n.get("messages", {}).get("acked", 0) for n in snapshot_nodes(tree)
               if role_of(n["id"]) == "producer")


def producer_messages(tree: dict) -> dict:
    """The first producer's counters ({} before it reports)."""
    return next((n.get("messages", {}) for n in snapshot_nodes(tree)
                 if role_of(n["id"]) == "producer" and n.get("messages")), {})


def producer_source(tree: dict) -> dict:
    """The first producer's source stats ({} before it reports)."""
    return producer_messages(tree).get("source", {})


def role(stage_id: str) -> str:
    return next((r for r in ("batch_processor", "batcher", "processor", "producer")
                 if stage_id.startswith(r)), stage_id)


def sample_cpu(tree: dict, seen: dict[int, tuple[str, float, float, float]]) -> None:
    """Every stage process's CPU seconds so far, by pid, read from ``/proc`` (psutil):
    (role, whole process, threads other than the main one, i.e. ZeroMQ's I/O threads, of
    the whole the kernel's share).  A stage that exited keeps its last sample."""
    for n in snapshot_nodes(tree):
        pid = n.get("pid")
        if pid and n.get("kind") == "worker":
            try:
                proc = psutil.Process(pid)
                t = proc.cpu_times()
                io = sum(th.user_time + th.system_time for th in proc.threads() if th.id != pid)
                seen[pid] = (role(n["id"]), t.user + t.system, io, t.system)
            except psutil.Error:
                pass
