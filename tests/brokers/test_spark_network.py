"""The path into Spark under the faults of a real network (tests/spark/netns.py).

The daemon runs in one network namespace, the Spark Connect server in another, joined by
a veth pair; the link is taken down (a partition) while the committer runs a Spark job.
RabbitMQ is the source (reached through a unix-socket relay, so only the way to Spark is
broken).  Every published id is counted against the dataset: 0 lost, 0 twice; the broker
is left empty; what was acked is never more than what was written; while the link is
down the source is held (the producer fetches nothing more once the stages are full),
memory stays bounded (the stages' RSS before, during, after) and ``status`` says Spark is
unreachable and since when.  Slow: a two-minute partition, a minute of a degraded link
(``tc`` qdiscs; packets lost at random with nftables), the Connect server restarted
mid-commit, each with RabbitMQ and with the spool as the source (every line once, the
spool fully acked; the 10 s partition too); the committer SIGKILLed behind a partition
while its job runs (the server carries the job on; the next incarnation settles its
session before reading back; the same with the committer's own connection alone cut,
while the next incarnation connects: tests/brokers/test_spark_dead_connection.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from datetime import UTC
from pathlib import Path

import pytest
from offbroadway.supervision.tree import snapshot_nodes

from tests.brokers.test_spark_no_window import backlog_config, publish
from tests.conftest import REPO, offbroadway_cmd, test_env, wait_until
from tests.e2e.test_pipeline import stage_pids, write_spool
from tests.spark.conftest import start_server
from tests.spark.dataset import assert_each_id_once, assert_each_message_exactly_once, rows
from tests.spark.netns import Link, link
from tests.spark.test_pipeline_spark import TOKEN_ENV, daemon_env, status

pytestmark = [pytest.mark.broker, pytest.mark.spark]

SERVER_PORT = 15003


@pytest.fixture
def net(short_tmp: Path):
    yield from link(short_tmp)


@pytest.fixture
def far_spark(net: Link, short_tmp: Path):
    """The Spark Connect server in its own namespace, at ``net.remote`` for the daemon."""
    handle = start_server(short_tmp / "srv", wrap=net.exec(net.srv, []), port=SERVER_PORT)
    net.relay_spark(SERVER_PORT)
    handle.remote = net.remote
    yield handle
    if handle.proc.poll() is None:
        handle.stop()


def start_in(net: Link, config: Path, tmp: Path, server) -> tuple[subprocess.Popen, Path]:
    """``run --until-idle`` in the client's namespace, stderr in a file."""
    log = tmp / "daemon.err"
    with open(log, "w") as err:
        daemon = subprocess.Popen(net.exec(net.cli, offbroadway_cmd("run", str(config),
                                                                    "--until-idle")),
                                  cwd=REPO, env=daemon_env(server),
                                  stdout=subprocess.DEVNULL, stderr=err)
    return daemon, log


def figures(sock: Path) -> dict:
    """From one status: the stages' RSS (MiB, the Spark server not among them: it is
    remote), the producer's fetched and acked, the committer's counters, spark_down."""
    st = status(sock)
    if not st:
        return {}
    nodes = {n["id"]: n for n in snapshot_nodes(st["tree"])}
    msgs = {k: n.get("messages", {}) for k, n in nodes.items()}
    rss = sum(n.get("rss_bytes") or 0 for k, n in nodes.items() if n.get("kind") == "worker")
    return {"rss_mib": rss / 2**20, "fetched": msgs.get("producer_0", {}).get("in", 0),
            "acked": st.get("acked", 0), "committer": msgs.get("committer_default", {}),
            "spark_down": st.get("spark_down") or []}


def partition_during_a_commit(net: Link, server, tmp: Path, rabbit, *, n: int,
                              seconds: float, retry: float | None = None) -> dict:
    """RabbitMQ (``n`` messages, 2,000 a second) → one batcher → the far Spark; the link
    down for ``seconds`` once the committer runs a job after a first commit (``rabbit``
    None: ``n`` spool lines instead, each with its ``seq``).  Every id once, nothing
    left in the source; returns what was seen."""
    if rabbit is None:
        write_spool(tmp / "spool", n, files=2, extra={"route": "default"})
        queue = None
    else:
        net.relay_rabbitmq()
        queue = rabbit.queue()
        ids = publish(rabbit, queue, n)
    config = backlog_config(tmp, server, queue, rate=2000, prefetch=4000, batch_size=500,
                            commit_rows=3000, commit_interval=0.5)
    if retry is not None:
        config.write_text(config.read_text() + f"write_retry_seconds = {retry}\n")
    daemon, log = start_in(net, config, tmp, server)
    sock = tmp / "run" / "control.sock"
    seen: dict = {"during": []}
    try:
        def in_a_job() -> dict:
            f = figures(sock)
            c = f.get("committer", {})
            return f if c.get("committing", 0) > 0 and c.get("commits", 0) > 0 else {}

        seen["before"] = wait_until(in_a_job, timeout=300, interval=0.05,
                                    message="the committer in a Spark job")
        net.down()
        t_down, down_at = time.monotonic(), time.time()
        while time.monotonic() < t_down + seconds:
            f = figures(sock)
            if f:
                f["t"] = time.monotonic() - t_down
                f["written"] = len(rows(tmp / "dataset", "default"))
                seen["during"].append(f)
            time.sleep(0.5)   # sampling the partition's length, not waiting for a state
        net.up()
        t_up = time.monotonic()
        commits = seen["during"][-1]["committer"].get("commits", 0)
        wait_until(lambda: figures(sock).get("committer", {}).get("commits", 0) > commits,
                   timeout=120, interval=0.1, message="a commit after the link came back")
        seen["back_after"] = time.monotonic() - t_up
        seen["after"] = figures(sock)
        code = daemon.wait(600)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    err = log.read_text()
    assert code == 0, err[-3000:]
    if rabbit is None:
        assert_each_message_exactly_once(rows(tmp / "dataset", "default"), n)
        assert not list((tmp / "spool").glob("*.jsonl")), "spool lines left unacked"
    else:
        assert_each_id_once(tmp, ids, err)
        assert rabbit.ready(queue) == 0, "messages left in the queue"
    seen.update(down_at=down_at, log=err)
    return seen


def check_partition(seen: dict, seconds: float) -> None:
    during = seen["during"]
    # nothing acked that is not written (acks trail the commits; the dataset is read after
    # the status, so a commit in between only makes the check looser, never wrong)
    for f in during:
        assert f["acked"] <= f["written"], f
    # the source is held: after the first seconds the producer fetches nothing more
    settled = [f for f in during if f["t"] >= seconds / 2]
    assert settled and settled[-1]["fetched"] == settled[0]["fetched"], \
        [(round(f["t"], 1), f["fetched"]) for f in during]
    # memory bounded: the stages' RSS during the partition within 1.5 x before + 64 MiB
    before = seen["before"]["rss_mib"]
    peak = max(f["rss_mib"] for f in during)
    assert peak <= 1.5 * before + 64, (before, peak)
    # status said Spark is unreachable, and since about when the link went down
    said = [f for f in during if f["spark_down"]]
    assert said, "status never said Spark was unreachable"
    line = said[-1]["spark_down"][0]
    assert "committer_default: unreachable since" in line, line
    since = seen["after"]["committer"].get("spark_unreachable_since") or \
        said[-1]["committer"]["spark_unreachable_since"]
    assert 0 <= since - seen["down_at"] <= 8, (since, seen["down_at"])
    # and no longer once the link is back
    assert not seen["after"]["spark_down"], seen["after"]["spark_down"]
    print(f"\nlink down {seconds:g} s: RSS before {before:.0f} MiB, peak during "
          f"{peak:.0f} MiB, after {seen['after']['rss_mib']:.0f} MiB; producer fetched "
          f"{during[0]['fetched']} -> {during[-1]['fetched']} during; status said "
          f"unreachable {said[0]['t']:.1f} s after the cut; a commit "
          f"{seen['back_after']:.1f} s after the link came back\n  {line}")


def test_a_partition_of_10_s_during_a_commit_writes_each_id_once(
        net: Link, far_spark, short_tmp: Path, rabbit) -> None:
    seen = partition_during_a_commit(net, far_spark, short_tmp, rabbit, n=30_000,
                                     seconds=10)
    check_partition(seen, 10)


@pytest.mark.slow
def test_a_partition_of_10_s_with_the_spool_as_source_writes_each_line_once(
        net: Link, far_spark, short_tmp: Path) -> None:
    """The same cut with the spool as the source (30,000 lines, 2,000 a second): every
    line in the dataset once (by its ``seq`` and its message id), the spool fully acked,
    the producer held while the link is down."""
    seen = partition_during_a_commit(net, far_spark, short_tmp, None, n=30_000,
                                     seconds=10)
    check_partition(seen, 10)


@pytest.mark.slow
def test_a_partition_of_2_minutes_during_a_commit_writes_each_id_once(
        net: Link, far_spark, short_tmp: Path, rabbit) -> None:
    """Two minutes: past gRPC's keepalive (60 s + 20 s), so the job's call fails and is
    retried (``write_retry_seconds`` 300 here: with the default 60 s, a partition that long
    fails the group's batches, which their source takes back, nothing lost) with the same
    stamp; the job the server finished meanwhile is not written twice."""
    seen = partition_during_a_commit(net, far_spark, short_tmp, rabbit, n=30_000,
                                     seconds=120, retry=300)
    check_partition(seen, 120)


@pytest.mark.slow
def test_a_partition_of_2_minutes_with_the_spool_as_source_writes_each_line_once(
        net: Link, far_spark, short_tmp: Path) -> None:
    """The two-minute cut with the spool as the source (30,000 lines, 2,000 a second,
    ``write_retry_seconds`` 300): every line once, the spool fully acked, the producer
    held and memory bounded while the link is down."""
    seen = partition_during_a_commit(net, far_spark, short_tmp, None, n=30_000,
                                     seconds=120, retry=300)
    check_partition(seen, 120)


def faulty_run(net: Link, server, tmp: Path, rabbit, *, n: int, fault, retry: float = 300,
               token_file: Path | None = None) -> str:
    """RabbitMQ (``n`` messages, 2,000 a second) → the far Spark; ``fault(sock)`` runs
    once the committer is in a job after a first commit; then until idle.  Every id
    once, the queue empty; returns the log.  ``rabbit`` None: ``n`` spool lines instead,
    each with its ``seq``: every line once, the spool fully acked."""
    if rabbit is None:
        write_spool(tmp / "spool", n, files=2, extra={"route": "default"})
        queue = None
    else:
        net.relay_rabbitmq()
        queue = rabbit.queue()
        ids = publish(rabbit, queue, n)
    config = backlog_config(tmp, server, queue, rate=2000, prefetch=4000, batch_size=500,
                            commit_rows=3000, commit_interval=0.5)
    config.write_text(config.read_text() + f"write_retry_seconds = {retry}\n")
    if token_file is not None:   # the token read from a file, at every connect
        config.write_text(config.read_text().replace(
            f'token_env = "{TOKEN_ENV}"', f'token_file = "{token_file}"'))
    daemon, log = start_in(net, config, tmp, server)
    sock = tmp / "run" / "control.sock"
    try:
        wait_until(lambda: (lambda c: c.get("committing", 0) > 0 and c.get("commits", 0) > 0)(
            figures(sock).get("committer", {})), timeout=300, interval=0.05,
            message="the committer in a Spark job")
        fault(sock)
        code = daemon.wait(900)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    err = log.read_text()
    assert code == 0, err[-3000:]
    if rabbit is None:
        assert_each_message_exactly_once(rows(tmp / "dataset", "default"), n)
        assert not list((tmp / "spool").glob("*.jsonl")), "spool lines left unacked"
    else:
        assert_each_id_once(tmp, ids, err)
        assert rabbit.ready(queue) == 0, "messages left in the queue"
    return err


def degraded_minute(net: Link, server, tmp: Path, rabbit, spec: tuple[str, ...],
                    loss: int, n: int = 150_000) -> None:
    """``spec``'s qdisc on both ends of the link for a minute, with ``loss`` % of the
    packets lost each way (nftables) if any, once the committer is in a job; ``n``
    messages (``rabbit`` None: spool lines) each once; prints what the fault did."""
    why = net.can(*spec)
    if why is not None:
        pytest.skip(why)
    if loss:
        net.require_drop()
    took: dict = {}

    def fault(sock: Path) -> None:
        before = figures(sock)["committer"].get("commits", 0)
        net.qdisc(*spec)
        if loss:
            net.loss(loss)
        t0 = time.monotonic()
        try:
            while time.monotonic() - t0 < 60:
                time.sleep(1)   # the fault's length
            took["counted"] = net.counted()
        finally:
            net.clear()
        took["commits"] = figures(sock)["committer"].get("commits", 0) - before
        took["seconds"] = time.monotonic() - t0

    t_run = time.monotonic()
    faulty_run(net, server, tmp, rabbit, n=n, fault=fault)
    assert took["commits"] > 0, "no commit went through the degraded link"
    c = took["counted"]
    assert c["qdisc_sent"] > 0, c   # the qdisc was on the link's way
    if loss:   # and the loss was: about loss % of what arrived at either end
        assert c["packets"] > 0 and 0 < c["lost"] <= 2 * loss / 100 * c["packets"], c
    what = " ".join(spec) + (f" + nft {loss}% loss each way" if loss else "")
    print(f"\n{took['commits']} commits in the {took['seconds']:.0f} s of {what}; "
          f"{c['qdisc_sent']} packets through the qdiscs, {c['qdisc_dropped']} dropped there"
          + (f"; {c['lost']} of {c['packets']} lost by nft "
             f"({100 * c['lost'] / max(1, c['packets']):.1f} %)" if loss else "")
          + f"; the run {time.monotonic() - t_run:.0f} s, {n:,} "
          + ("ids" if rabbit is not None else "spool lines") + " each once")


TBF = ("tbf", "rate", "1mbit", "burst", "32kbit", "latency", "50ms")


@pytest.mark.slow
@pytest.mark.parametrize(("spec", "loss"), [(("netem", "delay", "100ms", "loss", "5%"), 0),
                                            (TBF, 0), (TBF, 5)],
                         ids=["netem", "tbf", "tbf-nft-loss5"])
def test_delay_and_loss_for_a_minute_slow_the_commits_and_lose_nothing(
        net: Link, far_spark, short_tmp: Path, rabbit, spec: tuple[str, ...],
        loss: int) -> None:
    """The link degraded for a minute: ``tc netem delay 100ms loss 5%`` each way (200 ms a
    round trip; skipped where the kernel has no netem), or ``tc tbf``: 1 Mbit/s, packets
    that would queue more than 50 ms dropped, alone or with 5 % of the packets each way
    lost at random (nftables, :meth:`Link.loss`: loss where the kernel has no netem).
    Commits slower, every id once."""
    degraded_minute(net, far_spark, short_tmp, rabbit, spec, loss)


@pytest.mark.slow
@pytest.mark.parametrize(("spec", "loss"), [(("netem", "delay", "100ms", "loss", "5%"), 0),
                                            (TBF, 5)], ids=["netem", "tbf-nft-loss5"])
def test_a_degraded_link_with_the_spool_as_source_writes_each_line_once(
        net: Link, far_spark, short_tmp: Path, spec: tuple[str, ...], loss: int) -> None:
    """The same minute with the spool as the source (150,000 lines, 2,000 a second):
    every line once, by its ``seq`` and its message id; the spool fully acked."""
    degraded_minute(net, far_spark, short_tmp, None, spec, loss)


@pytest.mark.slow
@pytest.mark.parametrize("source", ["rabbitmq", "spool"])
def test_the_connect_server_restarted_mid_commit_lands_the_jobs_rows_once(
        net: Link, far_spark, short_tmp: Path, request, source: str) -> None:
    """The server SIGKILLed while the committer's job runs and started again on the same
    address (an upgrade's restart) with a new credential, rotated in the token file the
    committer reads at every connect: the job is retried with its stamp on the new server;
    every id once (30,000 RabbitMQ messages; or spool lines, the spool fully acked)."""
    import secrets

    rabbit = request.getfixturevalue("rabbit") if source == "rabbitmq" else None

    token_file = short_tmp / "spark.token"
    token_file.write_text(far_spark.token + "\n")
    token_file.chmod(0o600)

    def fault(_sock: Path) -> None:
        far_spark.proc.kill()
        far_spark.proc.wait()
        token = secrets.token_urlsafe(24)
        token_file.write_text(token + "\n")
        again = start_server(short_tmp / "srv", wrap=net.exec(net.srv, []),
                             port=SERVER_PORT, token=token)
        far_spark.proc, far_spark.token = again.proc, token

    t_run = time.monotonic()
    err = faulty_run(net, far_spark, short_tmp, rabbit, n=30_000, fault=fault,
                     token_file=token_file)
    assert "Spark write attempt" in err, err[-3000:]
    assert far_spark.token not in err
    print(f"\nthe server restarted mid-commit ({source}): "
          f"{err.count('Spark write attempt')} failed attempt(s) retried; the run "
          f"{time.monotonic() - t_run:.0f} s, 30,000 each once")


def watch_session_ops(net: Link, server, tmp: Path) -> tuple[subprocess.Popen, list[dict]]:
    """tests/spark/session_ops_proc.py in the server's namespace (no broken link on its
    way to the server): started now, ``ready`` awaited; it watches the session whose id
    is written to its stdin; its answers collect in the list returned, by a thread."""
    import json
    import threading

    with open(tmp / "session_ops.err", "w") as err:
        proc = subprocess.Popen(net.exec(net.srv, [sys.executable, str(
            REPO / "tests" / "spark" / "session_ops_proc.py")]), cwd=REPO,
            env={**test_env(), **server.bp_env}, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=err, text=True)
    assert proc.stdout is not None
    first = proc.stdout.readline().strip()
    assert first == "ready", (first, (tmp / "session_ops.err").read_text()[-2000:])
    answers: list[dict] = []

    def read() -> None:
        for line in proc.stdout:   # type: ignore[union-attr]
            answers.append(json.loads(line))

    threading.Thread(target=read, daemon=True).start()
    return proc, answers


@pytest.mark.slow
def test_a_dead_committers_job_carried_on_behind_a_partition_lands_each_id_once(
        net: Link, far_spark, short_tmp: Path, rabbit) -> None:
    """The window of a dead incarnation's job, opened by the network itself: while the
    committer's job runs on the far server (``GetStatus`` from the server's namespace
    says so), the link goes down and the committer is SIGKILLed; the server never sees
    its connection close and carries the job on to its end, its rows landing under the
    stamp the dead incarnation journaled.  Once the link is up, the committer the
    supervisor restarted settles that session before it reads anything back; every id
    once, the queue empty."""
    import os
    import signal

    from offbroadway.stages.spark.spark_once import Journal

    live = ("OPERATION_STATE_RUNNING", "OPERATION_STATE_TERMINATING")
    journals = short_tmp / "state" / "spark-commits"
    watcher, answers = watch_session_ops(net, far_spark, short_tmp)
    seen: dict = {}

    def utc(d):
        return d.astimezone(UTC).replace(tzinfo=None) if d.tzinfo else d

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
        known = set(first["ops"])   # the session's operations before the watch

        def running() -> list[str]:   # a job of the session started on the server now
            a = answers[-1]           # (caught at its start, so the kill comes mid-job)
            return [k for k, v in a.get("ops", {}).items() if v in live and k not in known]

        op = wait_until(running, timeout=120, interval=0.005,
                        message="a job of the committer's session running on the server")[0]
        net.down()
        os.kill(pid, signal.SIGKILL)
        t_kill, t0 = time.time(), time.monotonic()
        stamp = journal.last(1)[0]   # the job's, journaled before it started
        try:
            # the job goes on to its end on the server, behind the partition
            ended = wait_until(lambda: next(
                (a for a in answers if a["t"] > t_kill and
                 a.get("ops", {}).get(op) not in live), None),
                timeout=120, interval=0.05, message="the dead committer's job to end")
            ran_after = [a["t"] - t_kill for a in answers
                         if a["t"] > t_kill and a.get("ops", {}).get(op) in live]
            landed = [r for r in rows(short_tmp / "dataset", "default")
                      if utc(r["ingested_at"]) == utc(stamp)]
            started = next(a["t"] for a in answers if op in a.get("ops", {}))
            seen.update(op=op, session=session, ended=ended["ops"].get(op, "gone"),
                        killed_after=t_kill - started,
                        ended_after=ended["t"] - t_kill, ran_after=ran_after,
                        landed=len(landed))
            while time.monotonic() < t0 + 8:
                time.sleep(0.5)   # the partition's length, past the job's end
        finally:
            watcher.kill()
            net.up()
        seen["down_for"] = time.monotonic() - t0

    t_run = time.monotonic()
    try:
        err = faulty_run(net, far_spark, short_tmp, rabbit, n=30_000, fault=fault)
    finally:
        if watcher.poll() is None:
            watcher.kill()
        watcher.wait()
    # the job ran on the server after its client died, to its end, and wrote its rows
    assert seen["ran_after"], seen
    assert seen["ended"] in ("OPERATION_STATE_SUCCEEDED", "gone"), seen
    assert seen["landed"] > 0, seen
    # the next incarnation settled the dead one's session (forgotten by the journal once
    # settled), then read the last commits back, the dead job's rows among them
    settled = re.search(r"committer_default: (an earlier incarnation's Spark session "
                        r"settled[^\n]*|\d+ Spark operation\(s\) of an earlier "
                        r"incarnation were still running[^\n]*)", err)
    assert settled, err[-3000:]
    assert seen["session"] not in Journal(str(next(journals.glob("*.default")))).sessions()
    doubt = re.search(r"committer_default: (\d+) row\(s\) of the last (\d+) commit\(s\) "
                      r"before this start are in doubt", err[settled.end():])
    assert doubt and int(doubt[1]) >= seen["landed"], err[-3000:]
    print(f"\nthe committer killed {seen['killed_after']:.2f} s into its job, which ran "
          f"{max(seen['ran_after']):.2f} s after the kill "
          f"and ended ({seen['ended']}) {seen['ended_after']:.2f} s after it, "
          f"{seen['landed']} rows landed under its stamp; link down "
          f"{seen['down_for']:.1f} s; then: {settled[1]}; {doubt[1]} row(s) of the last "
          f"{doubt[2]} commit(s) in doubt; the run {time.monotonic() - t_run:.0f} s, "
          f"30,000 ids each once")
