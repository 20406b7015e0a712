"""A dead committer's job that the network keeps running while the next one reaches Spark.

The daemon in one network namespace, the Spark Connect server in another
(tests/spark/netns.py), RabbitMQ the source.  The committer's jobs are not reattachable:
a server that sees a job's connection close interrupts the job.  Here it does not see
it: the committer's own connection to Spark, and only that one, is cut (its packets
dropped at both ends of the link, :meth:`~tests.spark.netns.Link.cut`) and the
committer SIGKILLed while a job of its runs on the server, a job held there before its
task commits (tests/spark/slow_commit.py: the committer's own job, 30 s in its task's
commit), so the job still runs when the committer the supervisor restarts reaches the
server over a new connection, which nothing blocks.  That incarnation must make sure the
dead one's job is over before it reads the last commits back (left alone, the job would
land its rows after that read, and their redelivered copies would be written again):
every id in the dataset once, the queue empty.
"""

from __future__ import annotations

import os
import re
import signal
import time
from datetime import UTC
from pathlib import Path

import pytest

from tests.brokers.test_spark_network import SERVER_PORT, faulty_run, watch_session_ops
from tests.conftest import wait_until
from tests.e2e.test_pipeline import stage_pids
from tests.spark import slow_commit
from tests.spark.conftest import start_server
from tests.spark.dataset import rows
from tests.spark.netns import Link, link

pytestmark = [pytest.mark.broker, pytest.mark.spark]

HOLD_MS = 30_000   # the held job's task waits this long before its commit
LIVE = ("OPERATION_STATE_RUNNING", "OPERATION_STATE_TERMINATING")


@pytest.fixture
def net(short_tmp: Path):
    yield from link(short_tmp)


@pytest.fixture
def held_spark(net: Link, short_tmp: Path):
    """The far server (test_spark_network's ``far_spark``) whose next write task holds
    before its commit once ``.flag`` is written (tests/spark/slow_commit.py)."""
    net.require_drop()
    flag = short_tmp / "hold.flag"
    conf = slow_commit.build(short_tmp, flag)
    handle = start_server(short_tmp / "srv", wrap=net.exec(net.srv, []), port=SERVER_PORT,
                          conf=conf)
    net.relay_spark(SERVER_PORT)
    handle.remote = net.remote
    handle.flag = flag   # type: ignore[attr-defined]
    yield handle
    if handle.proc.poll() is None:
        handle.stop()


@pytest.mark.slow
def test_a_dead_committers_job_still_running_when_the_next_one_connects_lands_once(
        net: Link, held_spark, short_tmp: Path, rabbit) -> None:
    from offbroadway.stages.spark.spark_once import Journal

    flag: Path = held_spark.flag
    taken, done = Path(f"{flag}.taken"), Path(f"{flag}.done")
    journals = short_tmp / "state" / "spark-commits"
    watcher, answers = watch_session_ops(net, held_spark, short_tmp)
    seen: dict = {}

    def fault(sock: Path) -> None:
        pid = stage_pids(sock)["committer_default"]
        [path] = [p for p in journals.iterdir() if p.suffix == ".default"]
        journal = Journal(str(path))
        session = journal.sessions()[-1]   # the running incarnation's
        watcher.stdin.write(session + "\n")
        watcher.stdin.flush()
        first = wait_until(lambda: answers[:1], timeout=30, interval=0.01,
                           message="the server's first answer about the session")[0]
        assert "ops" in first, first
        flag.write_text(str(HOLD_MS))   # the next task commit of the committer's job holds
        wait_until(taken.exists, timeout=120, interval=0.01,
                   message="a task of the committer's job held before its commit")
        t_taken = time.time()

        def held_op() -> list[str]:   # the session's job running now: the held one
            a = answers[-1]
            return [k for k, v in a.get("ops", {}).items() if v in LIVE] \
                if a["t"] > t_taken else []

        [op] = wait_until(held_op, timeout=30, interval=0.01,
                          message="the held job running on the server")
        stamp = journal.last(1)[0]   # the job's, journaled before it started
        ports = net.cut(pid)   # the committer's own connection, and no other
        os.kill(pid, signal.SIGKILL)
        t_kill = time.time()
        new_session: dict[str, float] = {}

        def over(a: dict) -> bool:   # the held job no longer running, or its session gone
            if "ops" in a:            # (released by the next incarnation once its
                return a["ops"].get(op) not in LIVE   # operations were over)
            return any(k in a["error"] for k in ("SESSION_CLOSED", "SESSION_NOT_FOUND"))

        def op_over() -> dict | None:
            if not new_session:   # the next incarnation journals its session, then connects
                fresh = [s for s in journal.sessions() if s != session]
                if fresh:
                    new_session[fresh[-1]] = time.time()
            return next((a for a in answers if a["t"] > t_kill and over(a)), None)

        try:
            ended = wait_until(op_over, timeout=HOLD_MS / 1000 + 120, interval=0.02,
                               message="the dead committer's held job to end")
            [(new, t_new)] = new_session.items() or [("", 0.0)]
            live_after = [a["t"] for a in answers
                          if a["t"] > t_kill and a.get("ops", {}).get(op) in LIVE]
            seen.update(op=op, stamp=stamp, session=session, ports=ports, new=new,
                        new_after=t_new - t_kill if t_new else None,
                        ended=ended["ops"].get(op, "gone") if "ops" in ended else
                        f"session released ({ended['error'][:120]})",
                        ended_after=ended["t"] - t_kill,
                        live_after=(max(live_after) - t_kill) if live_after else None,
                        live_past_new=bool(t_new and live_after and max(live_after) > t_new),
                        held_for=t_kill - t_taken)
            seen["done"] = wait_until(lambda: done.exists() and done.read_text(),
                                      timeout=HOLD_MS / 1000 + 60, interval=0.1,
                                      message="the held task's own account")
        finally:
            watcher.kill()
        seen["cut_dropped"] = net.cut_counted()
        errors = [a["error"] for a in answers if "error" in a]
        seen["watch_errors"] = f"{len(errors)}" + (f" (first: {errors[0][:160]})"
                                                   if errors else "")

    t_run = time.monotonic()
    try:
        err = faulty_run(net, held_spark, short_tmp, rabbit, n=30_000, fault=fault)
    finally:
        if watcher.poll() is None:
            watcher.kill()
        watcher.wait()
    def utc(d):
        return d.astimezone(UTC).replace(tzinfo=None) if d.tzinfo else d

    landed = [r for r in rows(short_tmp / "dataset", "default")
              if utc(r["ingested_at"]) == utc(seen["stamp"])]
    settled = re.search(r"committer_default: an earlier incarnation's Spark session "
                        r"settled: (\d+) operation\(s\) still running[^\n]*", err)
    doubt = re.search(r"committer_default: (\d+) row\(s\) of the last (\d+) commit\(s\) "
                      r"before this start are in doubt", err[settled.end() if settled else 0:])
    print(f"\nthe committer killed {seen['held_for']:.2f} s into its held job, its "
          f"connection cut (port(s) {seen['ports']}, {seen['cut_dropped']} packet(s) "
          f"dropped); the next incarnation journaled its session {seen['new_after']} s "
          f"after the kill; the job was running {seen['live_after']} s after the kill "
          f"and ended ({seen['ended']}) {seen['ended_after']:.2f} s after it; the held "
          f"task: {seen['done']}; {len(landed)} row(s) under its stamp; then: "
          f"{settled[0].split(': ', 1)[1] if settled else 'no settle line'}; "
          f"{doubt[1] if doubt else '?'} row(s) of the last {doubt[2] if doubt else '?'} "
          f"commit(s) in doubt; the run {time.monotonic() - t_run:.0f} s, 30,000 ids "
          f"each once; the watch's failed asks: {seen['watch_errors']}")
    # the server never saw the dead committer's connection close: its job ran on, and
    # was still running once the next incarnation had journaled its session (which it
    # does just before it connects), until that incarnation ended it, long before the
    # task's hold would have
    assert seen["live_after"] is not None and seen["live_past_new"], seen
    assert seen["ended_after"] < HOLD_MS / 2000, seen
    assert seen["ended"] != "OPERATION_STATE_SUCCEEDED", seen
    assert seen["done"].startswith("interrupted"), seen
    assert seen["cut_dropped"] > 0, seen
    # the next incarnation found it running (its first look, before its interrupt), and
    # waited for it to end before it read anything back
    assert settled and int(settled[1]) == 1, err[-3000:]
    assert seen["session"] not in Journal(str(next(journals.glob("*.default")))).sessions()
    assert doubt, err[-3000:]
