"""The pipeline end to end, with real processes and sockets: spool → processors →
batchers → batch processors, acks back to the spool, drain and crashes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from offbroadway.daemon.core.outcome import EXIT_FAILED
from offbroadway.supervision.tree import snapshot_nodes

from tests.conftest import REPO, offbroadway_cmd, start_daemon, test_env, wait_until
from tests.e2e.daemon_status import tree_nodes
from tests.e2e.handlers import read_records


def write_spool(spool: Path, n: int, files: int = 2, extra: dict | None = None,
                bad_lines: tuple[int, ...] = ()) -> None:
    """n JSON lines (``{"seq": …, "route": even|odd, "key": seq % 3}``) over ``files`` files;
    the lines numbered in ``bad_lines`` are not JSON."""
    spool.mkdir(parents=True, exist_ok=True)
    per = (n + files - 1) // files
    seq = 0
    for f in range(files):
        lines = []
        for _ in range(per):
            if seq >= n:
                break
            if seq in bad_lines:
                lines.append("{not json")
            else:
                lines.append(json.dumps({"seq": seq, "route": "even" if seq % 2 == 0 else "odd",
                                         "key": seq % 3, **(extra or {})}))
            seq += 1
        (spool / f"part-{f:03d}.jsonl").write_text("\n".join(lines) + "\n")


def make_config(tmp: Path, *, batchers: dict | None = None,
                handler: str = "tests.e2e.handlers:Recorder",
                processors: int = 2, producers: int = 1, context: dict | None = None,
                shutdown_timeout: float = 20.0, spool: Path | None = None, max_demand: int = 10,
                source: str = "spool", options: dict | None = None) -> Path:
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    ctx = {"out": str(out), **(context or {})}
    ctx_toml = ", ".join(f"{k} = {json.dumps(v)}" for k, v in ctx.items())
    if options is None:
        options = {"path": str(spool or tmp / "spool")}
    opts = "\n".join(f"{k} = {json.dumps(v)}" for k, v in options.items())
    text = f"""
[pipeline]
name = "e2e"
handler = "{handler}"
shutdown_timeout = {shutdown_timeout}
context = {{ {ctx_toml} }}

[producer]
source = "{source}"
concurrency = {producers}

[producer.options]
{opts}

[processors.default]
concurrency = {processors}
max_demand = {max_demand}
min_demand = {max_demand // 2}

[metrics]
listen = ""

[runtime]
dir = "{tmp / 'run'}"
state_dir = "{tmp / 'state'}"
"""
    for key, b in (batchers or {}).items():
        settings = "\n".join(f"{k} = {json.dumps(v)}" for k, v in b.items())
        text += f"\n[batchers.{key}]\n{settings}\n"
    path = tmp / "pipeline.toml"
    path.write_text(text)
    return path


def run_until_idle(config: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run(offbroadway_cmd("run", str(config), "--until-idle"), cwd=REPO,
                          env=test_env(), capture_output=True, text=True, timeout=timeout)
    return proc


def run_until_idle_while(config: Path, during: Callable[[], object],
                         env: dict[str, str] | None = None,
                         timeout: float = 180) -> tuple[int, str, str]:
    """``run --until-idle`` with ``during()`` called while it runs (a kill, a hold): its
    exit code, stdout and stderr.  The daemon is killed if ``during`` fails."""
    daemon = subprocess.Popen(offbroadway_cmd("run", str(config), "--until-idle"), cwd=REPO,
                              env=env or test_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        during()
        out, err = daemon.communicate(timeout=timeout)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    return daemon.returncode, out, err


def handled_seqs(out: Path, prefix: str = "batch-") -> Counter:
    return Counter(r["id"] for r in read_records(str(out), prefix))


def test_every_line_handled_exactly_once_with_two_batchers(short_tmp: Path) -> None:
    n = 3000
    write_spool(short_tmp / "spool", n, files=3)
    config = make_config(short_tmp, batchers={
        "even": {"batch_size": 50, "batch_timeout": 0.5, "concurrency": 2},
        "odd": {"batch_size": 70, "batch_timeout": 0.5, "concurrency": 1}})
    proc = run_until_idle(config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_records(str(short_tmp / "out"), "batch-")
    counts = Counter(r["id"] for r in records)
    assert len(counts) == n, f"{n - len(counts)} lines never reached handle_batch"
    assert max(counts.values()) == 1, "a line was handled twice with nothing failing"
    for r in records:
        assert r["batcher"] == r["msg_batcher"]
        assert r["batch_key"] == r["msg_key"]
        limit = 50 if r["batcher"] == "even" else 70
        assert r["size"] <= limit
    # every message went to the batcher its data named
    by_batcher = Counter(r["batcher"] for r in records)
    assert by_batcher == {"even": n // 2, "odd": n // 2}
    # the spool is fully settled: files moved aside
    assert not list((short_tmp / "spool").glob("*.jsonl"))


def test_batch_timeout_emits_partial_batches(short_tmp: Path) -> None:
    write_spool(short_tmp / "spool", 7, files=1)
    config = make_config(short_tmp, batchers={
        "even": {"batch_size": 1000, "batch_timeout": 0.3},
        "odd": {"batch_size": 1000, "batch_timeout": 0.3}})
    daemon = start_daemon(config)
    try:
        out = short_tmp / "out"
        recs = wait_until(lambda: len(read_records(str(out), "batch-")) == 7 and
                          read_records(str(out), "batch-"), timeout=30,
                          message="the partial batches to time out")
        assert {r["trigger"] for r in recs} == {"timeout"}
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0


def test_bad_json_and_raising_handler_reach_handle_failed(short_tmp: Path) -> None:
    spool = short_tmp / "spool"
    spool.mkdir()
    lines = [json.dumps({"seq": 0}), "{nope", json.dumps({"seq": 2, "raise": True}),
             json.dumps({"seq": 3, "fail": True}), json.dumps({"seq": 4})]
    (spool / "a.jsonl").write_text("\n".join(lines) + "\n")
    config = make_config(short_tmp, batchers={"default": {"batch_size": 10, "batch_timeout": 0.2}})
    proc = run_until_idle(config)
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]   # finished, some failed
    failed = read_records(str(short_tmp / "out"), "failed-")
    reasons = {r["id"]: r["reason"] for r in failed}
    assert len(reasons) == 3, reasons
    assert any("JSON" in r or "json" in r for r in reasons.values())
    assert any("boom on purpose" in r for r in reasons.values())
    assert any("failed on purpose" in r for r in reasons.values())
    assert len(read_records(str(short_tmp / "out"), "batch-")) == 2


def test_bad_config_names_the_key_and_exits_2(short_tmp: Path) -> None:
    config = make_config(short_tmp)
    config.write_text(config.read_text().replace("max_demand = 10", 'max_demand = "ten"'))
    proc = subprocess.run(offbroadway_cmd("check", str(config)), cwd=REPO, env=test_env(),
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "processors.default.max_demand" in proc.stderr
    proc = subprocess.run(offbroadway_cmd("run", str(config)), cwd=REPO, env=test_env(),
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "processors.default.max_demand" in proc.stderr


def stage_pids(control_socket: Path) -> dict[str, int]:
    """Stage id → pid, as the running daemon's ``status --json`` reports them."""
    out = subprocess.run(offbroadway_cmd("status", "--json", "--socket", str(control_socket)),
                         cwd=REPO, env=test_env(), capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return {node["id"]: node["pid"] for node in snapshot_nodes(json.loads(out.stdout)["tree"])
            if node["kind"] == "worker" and node["pid"]}


def test_sigterm_drains_everything_fetched_and_fetches_nothing_more(short_tmp: Path) -> None:
    n = 4000
    write_spool(short_tmp / "spool", n, files=2)
    config = make_config(short_tmp, context={"slow": 0.002}, batchers={
        "even": {"batch_size": 100, "batch_timeout": 30.0},
        "odd": {"batch_size": 100, "batch_timeout": 30.0}})
    daemon = start_daemon(config)
    out = short_tmp / "out"
    # the whole tree up, not just the first batcher: a stop while the daemon is still
    # starting stops what has started without a drain (batches of the first key could
    # reach 500 records before batcher_odd had started, under load)
    sock = short_tmp / "run" / "control.sock"
    wait_until(lambda: len(read_records(str(out), "batch-")) >= 500 and
               tree_nodes(sock)["PipelineSupervisor"]["state"] == "running", timeout=60,
               message="the pipeline to get going")
    daemon.send_signal(signal.SIGTERM)
    code = daemon.wait(30)
    assert code == 0, daemon.stderr.read()[-3000:]
    first = handled_seqs(out)
    assert 0 < len(first) < n
    # partial batches were flushed at once, not after their 30 s timeout
    assert any(r["trigger"] == "flush" for r in read_records(str(out), "batch-"))
    # everything fetched before the signal was acked: a second run handles exactly the rest
    for f in out.glob("batch-*"):
        f.rename(f.with_name("run1-" + f.name))
    proc = run_until_idle(config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    second = handled_seqs(out)
    assert not (set(first) & set(second)), "lines handled before the drain were fetched again"
    assert len(set(first) | set(second)) == n


def spool_settled(state: Path, spool: Path) -> set[str]:
    """The ids (``file:line``) the spool had durably settled at this moment, read from its
    own books: a file moved to ``done`` is settled whole, any other file has the lines its
    record (``<state>/spool/<file>.acked``: ``1-50 52 54-60`` per settle call) names; a
    last line still being written is not counted."""
    settled: set[str] = set()
    for f in (spool / "done").glob("*.jsonl"):
        with open(f) as fh:
            settled.update(f"{f.name}:{k}" for k, _ in enumerate(fh, 1))
    for rec in (state / "spool").glob("*.acked"):
        name = rec.name[:-len(".acked")]
        for line in rec.read_text().splitlines(keepends=True):
            if line.startswith("#") or not line.endswith("\n"):
                continue
            for part in line.split():
                lo, _, hi = part.partition("-")
                settled.update(f"{name}:{k}" for k in range(int(lo), int(hi or lo) + 1))
    return settled


def producer_inflight(control: Path) -> int:
    """The producers' in-flight messages as their latest reports (a tick apart) say."""
    return sum(node.get("messages", {}).get("inflight", 0)
               for node in tree_nodes(control).values() if node["id"].startswith("producer_"))


# two victims by default; the others are long (pytest -m slow)
@pytest.mark.parametrize("victim", [
    "processor_default_0", pytest.param("batcher_even", marks=pytest.mark.slow),
    "batch_processor_even_0", pytest.param("producer_0", marks=pytest.mark.slow)])
def test_sigkill_of_any_stage_loses_nothing(short_tmp: Path, victim: str) -> None:
    """SIGKILL one stage mid-run: every line is written, and a line is written twice only
    if it was in flight at the kill.  The books that say so:

    * a stage downstream of the producers: the producers hand back everything in flight
      when its crash cascade is down (each requeue logs how many), and only those can come
      again, so duplicates <= requeued;
    * a producer: nothing is requeued; its source still holds, unsettled, whatever it had
      handed out and not had acked, and its successor reads that again.  Stages downstream
      keep writing the dead producer's messages (their acks reach nobody), so exactly
      those written ones come twice.  Tokens say who delivered a record (an incarnation's
      tokens start at its start time in ns), and the spool's record, read while the
      producer is stopped just before its SIGKILL, says what was settled at the kill."""
    n = 10_000
    write_spool(short_tmp / "spool", n, files=4)
    config = make_config(short_tmp, producers=2, context={"slow": 0.0002}, batchers={
        "even": {"batch_size": 100, "batch_timeout": 0.5, "concurrency": 2},
        "odd": {"batch_size": 100, "batch_timeout": 0.5}})
    control = short_tmp / "run" / "control.sock"
    daemon = start_daemon(config, "--until-idle")
    out = short_tmp / "out"
    try:
        wait_until(control.exists, timeout=30, message="control socket")
        wait_until(lambda: len(read_records(str(out), "batch-")) >= 1000, timeout=60,
                   message="messages to flow")
        # work in flight at the kill: the run is not over, the producers hold messages out
        # (reports come once a second: on a fast run the first ones predate the flow)
        inflight = wait_until(lambda: producer_inflight(control), timeout=30, interval=0.05,
                              message="a report of messages in flight")
        pid = stage_pids(control)[victim]
        os.kill(pid, signal.SIGSTOP)         # its books hold still while they are read
        handled_at_kill = len(handled_seqs(out))
        settled_at_kill = spool_settled(short_tmp / "state", short_tmp / "spool")
        killed_at = time.time_ns()           # later than every token the victim issued
        os.kill(pid, signal.SIGKILL)
        assert inflight > 0 and handled_at_kill < n, (inflight, handled_at_kill)
        code = daemon.wait(120)
    finally:
        if daemon.poll() is None:
            daemon.kill()
    err = daemon.stderr.read()
    assert code == 0, err[-3000:]
    # the victim died of the kill and its restart was counted
    assert re.search(rf"worker {victim} \(pid {pid}\) of \S+ killed by SIGKILL", err), err[-3000:]
    assert re.search(rf"worker {victim} \(pid \d+\) of \S+ is ready \(restart 1\)", err)
    records = read_records(str(out), "batch-")
    counts = Counter(r["id"] for r in records)
    assert len(counts) == n, f"{n - len(counts)} lines lost after killing {victim}"
    dups = sum(c - 1 for c in counts.values())
    requeued = sum(int(k) for k in re.findall(r"requeued (\d+) in-flight messages", err))
    if victim.startswith("producer_"):
        index = int(victim.rpartition("_")[2])
        assert requeued == 0, "no stage downstream died: nothing to requeue"
        # delivered by the dead incarnation, written, and not settled at the kill: in
        # flight at the kill, so its successor delivers each of them again
        mine = [r for r in records if r["origin"] == index]
        before = Counter(r["id"] for r in mine if r["token"] < killed_at)
        after = Counter(r["id"] for r in mine if r["token"] > killed_at)
        assert max(before.values(), default=1) == 1 and max(after.values(), default=1) == 1, \
            "an incarnation wrote a line twice"
        in_flight = set(before) - settled_at_kill
        assert in_flight, "nothing the victim handed out was in flight at the kill"
        twice = {i for i, c in counts.items() if c > 1}
        assert twice == set(before) & set(after) == in_flight, (
            len(twice), len(set(before) & set(after)), len(in_flight))
        assert not set(after) & settled_at_kill, "a line settled before the kill came again"
        bound = len(in_flight)
    else:
        # the crash handed back what was in flight when its cascade was down
        assert requeued > 0, "the kill handed nothing back: nothing was in flight"
        bound = requeued
    print(f"killed {victim}: {dups} duplicates of {n} ({requeued} requeued, "
          f"bound {bound}; {inflight} in flight in the last report before the kill)")
    assert dups <= bound, (dups, bound)
    assert not list((short_tmp / "spool").glob("*.jsonl")), "spool not fully acked"
