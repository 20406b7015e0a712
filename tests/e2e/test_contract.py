"""Broadway's callback contract through the daemon, with real processes: cases taken from
Broadway's own tests.

* ``prepare_messages`` returning fewer messages than it got fails the whole group with a
  clear reason (nothing stays in flight), in the daemon and in ``offbroadway.testing``;
* ``sys.exit()`` in any callback fails only the messages concerned and never kills the stage;
* ``--until-idle`` exits 0 only once every message is written and acked, even when a batch
  processor is SIGKILLed during the drain;
* an operator's ``restart processor_default_0`` restarts what its crash would: every
  processor, batcher and batch processor.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from offbroadway.daemon.core.outcome import EXIT_FAILED
from offbroadway.supervision.tree import snapshot_find
from offbroadway.testing import test_messages

from tests.conftest import REPO, offbroadway_cmd, start_daemon, test_env, wait_until
from tests.e2e.handlers import Contract, read_records
from tests.e2e.test_pipeline import make_config, run_until_idle, run_until_idle_while, stage_pids

HANDLER = "tests.e2e.handlers:Contract"


def _spool(tmp: Path, lines: list[dict]) -> None:
    spool = tmp / "spool"
    spool.mkdir(parents=True, exist_ok=True)
    (spool / "part-000.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")


def _id(i: int) -> str:
    return f"part-000.jsonl:{i + 1}"


def _restarts(stderr: str) -> list[str]:
    """Log lines of a stage that died or came back (any restart at all)."""
    return [line for line in stderr.splitlines()
            if re.search(r"worker \S+ \(pid \d+\) of \S+ (killed|exited with code)", line)
            or "(restart " in line]


# -- prepare_messages returning fewer messages ---------------------------------------------
def test_prepare_messages_dropping_a_message_fails_its_group_in_the_daemon(short_tmp: Path
                                                                          ) -> None:
    n, dropped = 200, 77
    _spool(short_tmp, [{"seq": i, "drop": i == dropped} for i in range(n)])
    # no batchers: handled messages are acked by the processor; max_demand 10 makes frames
    # of several messages, so the group is more than the dropped one
    config = make_config(short_tmp, handler=HANDLER, batchers={
        "default": {"batch_size": 10, "batch_timeout": 0.1}})
    proc = run_until_idle(config)
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]   # finished, some failed
    out = str(short_tmp / "out")
    failed = read_records(out, "failed-")
    handled = read_records(out, "batch-")
    reason = [f for f in failed if f["id"] == _id(dropped)]
    assert len(reason) == 1, failed
    assert "prepare_messages returned" in reason[0]["reason"]
    assert "it must return every message" in reason[0]["reason"]
    # the whole group failed with it, and every message was settled exactly once: nothing
    # was left in flight (the run drained and the spool is empty)
    assert all(f["reason"] == reason[0]["reason"] for f in failed)
    ids = Counter([f["id"] for f in failed] + [h["id"] for h in handled])
    assert set(ids) == {_id(i) for i in range(n)} and max(ids.values()) == 1
    assert not list((short_tmp / "spool").glob("*.jsonl"))
    assert _restarts(proc.stderr) == []


def test_messages_a_handler_builds_itself_are_acked_for_the_ones_they_replace(
        short_tmp: Path) -> None:
    """``handle_message`` returning ``Message(m.id, new_data)`` (and ``prepare_messages``
    returning rebuilt ones): the new messages are written and acked in place of the given
    ones, so the run drains with nothing left in flight and exits 0."""
    n = 120
    _spool(short_tmp, [{"seq": i, "rebuild_in": "prepare" if i % 3 == 0 else "handle"}
                       for i in range(n)])
    config = make_config(short_tmp, handler="tests.e2e.handlers:Rebuilds", batchers={
        "default": {"batch_size": 10, "batch_timeout": 0.1}}, shutdown_timeout=10.0)
    proc = run_until_idle(config)
    assert proc.returncode == 0, proc.stderr[-3000:]
    handled = read_records(str(short_tmp / "out"), "batch-")
    assert Counter(h["id"] for h in handled) == Counter(_id(i) for i in range(n))
    assert read_records(str(short_tmp / "out"), "failed-") == []
    assert not list((short_tmp / "spool").glob("*.jsonl"))
    assert _restarts(proc.stderr) == []


def test_prepare_messages_dropping_a_message_in_offbroadway_testing() -> None:
    import tempfile

    # handle_failed of the Recorder writes its records to context["out"]
    with tempfile.TemporaryDirectory() as out:
        result = test_messages(Contract(), [{"seq": 0}, {"seq": 1, "drop": True}, {"seq": 2}],
                               context={"out": out})
    assert result.successful == []
    assert [m.data["seq"] for m in result.failed] == [0, 1, 2]
    assert all("prepare_messages returned 2 messages for the 3" in m.status
               for m in result.failed)


# -- SystemExit in every callback ------------------------------------------------------------
@pytest.mark.parametrize("callback", ["prepare_messages", "handle_message", "handle_batch",
                                      "handle_failed"])
def test_sys_exit_in_a_callback_fails_only_its_messages(short_tmp: Path, callback: str) -> None:
    n, at = 200, 50
    lines = [{"seq": i} for i in range(n)]
    lines[at] = {"seq": at, "exit_in": callback, "fail": callback == "handle_failed"}
    _spool(short_tmp, lines)
    config = make_config(short_tmp, handler=HANDLER, batchers={
        "default": {"batch_size": 10, "batch_timeout": 0.1}})
    proc = run_until_idle(config)
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]   # finished, some failed
    # no stage died: no restart, no crash loop, no poison strike
    assert _restarts(proc.stderr) == [], _restarts(proc.stderr)
    out = str(short_tmp / "out")
    failed = {f["id"]: f["reason"] for f in read_records(out, "failed-")}
    handled = Counter(h["id"] for h in read_records(out, "batch-"))
    assert _id(at) in failed, failed
    if callback == "handle_failed":
        # it fails anyway; handle_failed ran (it recorded before exiting)
        assert failed[_id(at)] == "failed on purpose"
    else:
        assert failed[_id(at)] == f"{callback} raised SystemExit: {callback_code(callback)}"
    # only the messages concerned: its group for a group callback, itself otherwise
    if callback == "handle_message":
        assert set(failed) == {_id(at)}
    assert all(r == failed[_id(at)] for r in failed.values())
    assert set(failed) | set(handled) == {_id(i) for i in range(n)}
    assert not set(failed) & set(handled) and max(handled.values()) == 1
    assert not list((short_tmp / "spool").glob("*.jsonl"))


def callback_code(callback: str) -> int:
    return {"prepare_messages": 3, "handle_message": 4, "handle_batch": 5}[callback]


# -- a batch processor SIGKILLed during an --until-idle drain --------------------------------
def _status(sock: Path) -> dict:
    out = subprocess.run(offbroadway_cmd("status", "--json", "--socket", str(sock)), cwd=REPO,
                         env=test_env(), capture_output=True, text=True, timeout=30)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def _node(tree: dict, child_id: str) -> dict:
    """The node ``child_id`` of a status tree ({} if it has none)."""
    return snapshot_find(tree, child_id) or {}


def test_until_idle_waits_for_every_message_when_a_batch_processor_dies_in_the_drain(
        short_tmp: Path) -> None:
    n = 600
    _spool(short_tmp, [{"seq": i} for i in range(n)])
    # slow batches: the drain (what is in flight when the source is exhausted) lasts seconds
    config = make_config(short_tmp, handler=HANDLER, context={"batch_slow": 0.5},
                         batchers={"default": {"batch_size": 20, "batch_timeout": 0.2,
                                               "concurrency": 2}})
    sock = short_tmp / "run" / "control.sock"
    seen: dict[str, int] = {}

    def kill() -> None:
        # the drain has begun with work in flight: kill a batch processor then
        s = wait_until(lambda: (st := _status(sock)) and st.get("draining") and st,
                       timeout=90, interval=0.05, message="the drain to begin")
        victim = _node(s["tree"], "batch_processor_default_0")
        inflight = _node(s["tree"], "producer_0").get("messages", {}).get("inflight", 0)
        assert victim.get("pid") and inflight > 0, (victim, inflight)
        seen["inflight"] = inflight
        os.kill(victim["pid"], signal.SIGKILL)

    code, out, err = run_until_idle_while(config, kill)
    assert code == 0, err[-3000:]
    assert "running again until idle" in err, err[-3000:]
    handled = Counter(h["id"] for h in read_records(str(short_tmp / "out"), "batch-"))
    assert set(handled) == {_id(i) for i in range(n)}, f"{n - len(handled)} never written"
    # duplicates only among what the requeue handed back (it logs how many)
    requeued = sum(int(k) for k in re.findall(r"requeued (\d+) in-flight messages", err))
    assert sum(handled.values()) - n <= requeued, (sum(handled.values()) - n, requeued,
                                                   seen["inflight"])
    assert not read_records(str(short_tmp / "out"), "failed-")
    assert not list((short_tmp / "spool").glob("*.jsonl")), "messages left unacked"
    assert f"{n} messages acked" in out or "messages acked" in out


# -- an operator's restart of a processor: the cascade of its crash --------------------------
def test_operator_restart_of_a_processor_restarts_the_batchers_too(short_tmp: Path) -> None:
    _spool(short_tmp, [{"seq": i} for i in range(50)])
    config = make_config(short_tmp, handler=HANDLER, batchers={
        "default": {"batch_size": 10, "batch_timeout": 0.2}})
    sock = short_tmp / "run" / "control.sock"
    daemon = start_daemon(config)
    try:
        wait_until(lambda: len(read_records(str(short_tmp / "out"), "batch-")) == 50,
                   timeout=60, message="the messages handled")
        before = stage_pids(sock)
        out = subprocess.run(offbroadway_cmd("restart", "processor_default_0", "--socket",
                                             str(sock)), cwd=REPO, env=test_env(),
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        downstream = [s for s in before if not s.startswith("producer_")]
        assert {"processor_default_0", "processor_default_1", "batcher_default",
                "batch_processor_default_0"} <= set(downstream)
        after = wait_until(lambda: (p := stage_pids(sock)) and all(
            p.get(s) not in (None, before[s]) for s in downstream) and p, timeout=30,
            message="every processor, batcher and batch processor restarted")
        assert after["producer_0"] == before["producer_0"]
        tree = _status(sock)["tree"]
        assert _node(tree, "ProcessorSupervisor")["restarts"] == 1
        assert _node(tree, "BatchersSupervisor")["restarts"] == 1
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()
    assert daemon.returncode == 0
