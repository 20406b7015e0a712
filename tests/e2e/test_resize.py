"""Resizing a running pipeline (``offbroadway scale``, and a reload that changes a
concurrency): grown and shrunk mid-stream, every message is handled exactly once and
acked, nothing is requeued, no restart is counted, and status and /metrics show the new
shape; bad input gets one line.

The rate limit keeps the stream flowing for the whole test (1,000 messages a second,
whatever the shape), so every resize lands mid-stream and the books are checked after.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from offbroadway.daemon.cli import control
from offbroadway.supervision.tree import snapshot_nodes

from tests.conftest import REPO, offbroadway_cmd, start_daemon, test_env, wait_until
from tests.e2e.handlers import read_records
from tests.e2e.test_operations import free_port
from tests.e2e.test_pipeline import make_config, write_spool

#: what the tests do to the shape, in order: (scale arguments, processors, batch processors)
SEQUENCE = [(["processors", "4"], 4, 1),
            (["batch_processors", "default", "3"], 4, 3),
            (["processors", "1"], 1, 3),
            (["batch_processors", "default", "1"], 1, 1),
            (["processors", "3"], 3, 1)]   # ids 1 and 2 again, fresh


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(offbroadway_cmd(*args), cwd=REPO, env=test_env(),
                          capture_output=True, text=True, timeout=timeout)


def resizable_config(tmp: Path, port: int, **kwargs) -> Path:
    """Two processors, one batcher with one batch processor, 1,000 messages a second."""
    config = make_config(tmp, batchers={"default": {"batch_size": 50, "batch_timeout": 0.2}},
                         context={"batcher": "default", "slow": 0.002}, **kwargs)
    text = config.read_text().replace(
        "[producer.options]",
        "rate_limit = { allowed_messages = 500, interval = 0.5 }\n\n[producer.options]")
    config.write_text(text.replace('listen = ""', f'listen = "127.0.0.1:{port}"'))
    return config


@contextmanager
def shown_if_failing(daemon: subprocess.Popen, *also: subprocess.Popen) -> Iterator[None]:
    """A failure inside kills the daemon (and ``also``) and prints the end of its log."""
    try:
        yield
    except BaseException:
        for proc in (daemon, *also):
            if proc.poll() is None:
                proc.kill()
        _, err = daemon.communicate(timeout=30)
        print(err[-5000:])
        raise


def status(sock: str) -> dict:
    res = cli("status", "--json", "--socket", sock)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def shape_of(st: dict) -> tuple[list[str], list[str]]:
    """(processors, batch processors) running, from status --json."""
    nodes = list(snapshot_nodes(st["tree"]))
    procs = [n["id"] for n in nodes if n["id"].startswith("processor_")
             and n["state"] == "running"]
    bps = [n["id"] for n in nodes if n["id"].startswith("batch_processor_")
           and n["state"] == "running"]
    return procs, bps


def children_up(port: int) -> set[str]:
    """The children /metrics reports up."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    up = set()
    for line in text.splitlines():
        if line.startswith("offbroadway_child_up{") and line.endswith(" 1.0"):
            up.add(line.split('child="', 1)[1].split('"', 1)[0])
    return up


def resize_midstream(tmp: Path, config: Path, port: int, total: int,
                     handled: Callable[[], int],
                     then: Callable[[str], None] = lambda sock: None,
                     env: dict[str, str] | None = None) -> dict:
    """Run ``config`` --until-idle, carry out :data:`SEQUENCE` while messages flow, check
    the shape after each step, call ``then(socket)``, and return the daemon's
    stdout/stderr and last status."""
    sock = str(tmp / "run" / "control.sock")
    daemon = subprocess.Popen(offbroadway_cmd("run", str(config), "--until-idle"), cwd=REPO,
                              env=env or test_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    with shown_if_failing(daemon):
        wait_until(lambda: handled() >= total // 10, timeout=90, message="messages flow")
        for words, n_proc, n_bp in SEQUENCE:
            res = cli("scale", *words, "--socket", sock)
            assert res.returncode == 0, res.stderr
            assert res.stdout.startswith("scale: ") and "->" in res.stdout, res.stdout
            st = status(sock)
            procs, bps = shape_of(st)
            assert procs == [f"processor_default_{i}" for i in range(n_proc)], procs
            assert bps == [f"batch_processor_default_{i}" for i in range(n_bp)], bps
            assert all(node["restarts"] == 0 for node in snapshot_nodes(st["tree"])), \
                "a resize counted as a restart"
            # /metrics answers scrapes within 0.5 s from one snapshot: poll to a deadline
            shape = set(procs + bps)
            wait_until(lambda shape=shape: {p for p in children_up(port)
                                            if p.startswith(("processor_", "batch_processor_"))}
                       == shape, timeout=10, interval=0.2,
                       message=f"/metrics to show up exactly {sorted(shape)}")
        then(sock)
        # every resize landed mid-stream: the source was not exhausted yet
        assert handled() < total, "the stream ended before the resizes: the test proves nothing"
        last = status(sock)
        out, err = daemon.communicate(timeout=240)
    assert daemon.returncode == 0, err[-5000:]
    assert "requeued" not in err, "a resize handed messages back to the source"
    assert "Traceback" not in err, err[-5000:]
    return {"stdout": out, "stderr": err, "status": last}


# the RabbitMQ case (tests/brokers/test_resize_brokers.py) is the default run's
@pytest.mark.slow
def test_scale_up_and_down_midstream_spool_exact_books(short_tmp: Path) -> None:
    n = 16_000
    write_spool(short_tmp / "spool", n, files=4, extra={"route": "default"})
    port = free_port()
    config = resizable_config(short_tmp, port)
    out = short_tmp / "out"
    run = resize_midstream(short_tmp, config, port, n,
                           lambda: len(read_records(str(out), "batch-")))
    counts = Counter(r["id"] for r in read_records(str(out), "batch-"))
    assert len(counts) == n, f"{n - len(counts)} lines never reached handle_batch"
    assert max(counts.values()) == 1, "a line was handled twice with nothing failing"
    assert not read_records(str(out), "failed-")
    assert not list((short_tmp / "spool").glob("*.jsonl")), "spool not fully acked"
    assert f"e2e: {n} messages acked, 0 failed" in run["stdout"], run["stdout"]
    producer = next(nd for nd in snapshot_nodes(run["status"]["tree"]) if nd["id"] == "producer_0")
    assert producer["messages"]["requeued"] == 0


# long: not in the default run (pytest -m slow)
@pytest.mark.slow
def test_bad_scale_input_is_one_line_and_changes_nothing(short_tmp: Path) -> None:
    write_spool(short_tmp / "spool", 100, files=1, extra={"route": "default"})
    port = free_port()
    config = resizable_config(short_tmp, port)
    sock = str(short_tmp / "run" / "control.sock")
    daemon = start_daemon(config)
    try:
        wait_until(lambda: Path(sock).exists() and status(sock)["tree"]["state"] == "running",
                   timeout=60, message="the daemon up")
        before = shape_of(status(sock))
        for words, code, says in [
                (["processors", "0"], 2, "processors count must be at least 1, not 0"),
                (["processors", "two"], 2, "must be a whole number, not 'two'"),
                (["processors"], 2, "takes one number"),
                (["producers", "3"], 2, "cannot scale 'producers'"),
                (["batch_processors", "nope", "2"], 1, "no batcher 'nope' (batchers: default)"),
                (["batch_processors", "default", "-1"], 2, "must be at least 1")]:
            res = cli("scale", *words, "--socket", sock)
            lines = res.stderr.strip().splitlines()
            assert res.returncode == code and len(lines) == 1 and says in lines[0], res
            assert "Traceback" not in res.stderr
        # the daemon checks what it is sent, whatever the client
        path = str(short_tmp / "run" / control.CONTROL_SOCKET)
        for args in ("processors 2", None, ["processors", 0], ["processors", True]):
            reply = control.request(path, {"cmd": "scale", "args": args})
            assert reply["ok"] is False and "scale refused" in reply["error"], reply
            assert "\n" not in reply["error"]
        assert cli("scale", "processors", "2", "--socket", sock).stdout.startswith(
            "scale: nothing to change: 2 processors")
        assert shape_of(status(sock)) == before
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, err = daemon.communicate(timeout=120)
    assert daemon.returncode == 0, err[-3000:]
    assert "Traceback" not in err


# long: not in the default run (pytest -m slow)
@pytest.mark.slow
def test_reload_resizes_through_the_same_path(short_tmp: Path) -> None:
    """A reload that changes concurrencies resizes (and batch_size with it); one that
    would resize a partitioned stage is refused naming the key, nothing changed."""
    n = 6000
    write_spool(short_tmp / "spool", n, files=2, extra={"route": "default"})
    port = free_port()
    config = resizable_config(short_tmp, port)
    base = config.read_text()
    sock = str(short_tmp / "run" / "control.sock")
    out = short_tmp / "out"
    daemon = start_daemon(config, "--until-idle")
    with shown_if_failing(daemon):
        wait_until(lambda: len(read_records(str(out), "batch-")) >= 500, timeout=90,
                   message="messages flow")
        config.write_text(base.replace("concurrency = 2", "concurrency = 3").replace(
            "batch_timeout = 0.2", "batch_timeout = 0.2\nconcurrency = 2"))
        res = cli("reload", "--socket", sock)
        assert res.returncode == 0, res.stderr
        assert "processors.default.concurrency 2 -> 3" in res.stdout, res.stdout
        assert "batchers.default.concurrency 1 -> 2" in res.stdout, res.stdout
        st = status(sock)
        assert shape_of(st) == (["processor_default_0", "processor_default_1",
                                 "processor_default_2"],
                                ["batch_processor_default_0", "batch_processor_default_1"])
        # SIGHUP takes the same path, down
        config.write_text(base.replace("concurrency = 2", "concurrency = 1"))
        daemon.send_signal(signal.SIGHUP)
        wait_until(lambda: shape_of(status(sock)) == (["processor_default_0"],
                                                      ["batch_processor_default_0"]),
                   timeout=60, message="the reload's shrink")
        # refused: partition_by ties an index to a partition; nothing changes
        config.write_text(base.replace("concurrency = 2", "concurrency = 2\npartition_by = "
                                                          '"route"'))
        res = cli("reload", "--socket", sock)
        assert res.returncode == 1 and len(res.stderr.strip().splitlines()) == 1, res
        assert "processors.default.partition_by" in res.stderr, res.stderr
        assert shape_of(status(sock))[0] == ["processor_default_0"]
        assert all(nd["restarts"] == 0 for nd in snapshot_nodes(status(sock)["tree"]))
        assert len(read_records(str(out), "batch-")) < n, "the stream ended first"
        _, err = daemon.communicate(timeout=240)
    assert daemon.returncode == 0, err[-3000:]
    counts = Counter(r["id"] for r in read_records(str(out), "batch-"))
    assert len(counts) == n and max(counts.values()) == 1
    assert "requeued" not in err


def held_pipeline(tmp: Path, n: int, **kwargs) -> tuple[Path, Path, subprocess.Popen]:
    """A resizable pipeline (200 messages a second) whose processor_default_1 blocks in
    handle_message while ``<tmp>/hang`` exists; started --until-idle and flowing, then
    held: (the flag, the control socket, the daemon)."""
    write_spool(tmp / "spool", n, files=2, extra={"route": "default"})
    flag = tmp / "hang"
    config = resizable_config(tmp, free_port(), **kwargs)
    config.write_text(config.read_text().replace(
        'handler = "tests.e2e.handlers:Recorder"',
        'handler = "tests.e2e.resize_handlers:HangsWhileFlagged"').replace(
        "context = {", f'context = {{ hang_flag = "{flag}", hang_stage = '
                       f'"processor_default_1", ').replace(
        "allowed_messages = 500", "allowed_messages = 100"))
    daemon = start_daemon(config, "--until-idle")
    with shown_if_failing(daemon):
        wait_until(lambda: len(read_records(str(tmp / "out"), "batch-")) >= 200, timeout=90,
                   message="messages flow")
        flag.touch()
        wait_until(lambda: Path(f"{flag}.hung").exists(), timeout=30,
                   message="processor_default_1 held in handle_message")
    return flag, tmp / "run" / "control.sock", daemon


def one_processor_again(sock: str) -> dict:
    """The status once processor_default_0 alone runs (a restart may be under way)."""
    return wait_until(lambda: (lambda s: shape_of(s)[0] == ["processor_default_0"] and s)(
        status(sock)), timeout=60, message="processor_default_0 back")


def assert_nothing_lost(tmp: Path, n: int, log: str) -> None:
    """Every line handled, the spool acked, and duplicates only within what a requeue
    (there was one) took."""
    counts = Counter(r["id"] for r in read_records(str(tmp / "out"), "batch-"))
    assert len(counts) == n, f"{n - len(counts)} lines lost"
    requeued = sum(int(line.split("requeued ")[1].split()[0]) for line in log.splitlines()
                   if ": requeued " in line)
    assert requeued > 0
    assert sum(counts.values()) - n <= requeued, "more duplicates than the requeue took"
    assert not list((tmp / "spool").glob("*.jsonl")), "spool not fully acked"


# long: not in the default run (pytest -m slow)
@pytest.mark.slow
def test_a_stage_killed_while_it_leaves_is_a_crash_and_the_resize_still_ends(
        short_tmp: Path) -> None:
    """processor_default_1 is held in handle_message, told to leave, and SIGKILLed: one
    crash cascade (counted, one requeue), the new shape, and the resize answers; nothing
    is lost, and only what the requeue took can run twice."""
    n = 4000
    flag, sock_path, daemon = held_pipeline(short_tmp, n)
    sock = str(sock_path)
    with shown_if_failing(daemon):
        victim = next(nd["pid"] for nd in snapshot_nodes(status(sock)["tree"])
                      if nd["id"] == "processor_default_1")
        scale = subprocess.Popen(offbroadway_cmd("scale", "processors", "1", "--socket", sock),
                                 cwd=REPO, env=test_env(), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
    with shown_if_failing(daemon, scale):
        wait_until(lambda: status(sock)["leaving"] == ["processor_default_1"], timeout=30,
                   message="processor_default_1 leaving")
        os.kill(victim, signal.SIGKILL)
        said, err = scale.communicate(timeout=60)
        assert scale.returncode == 0, err
        assert "-> 1 processors" in said, said
        st = one_processor_again(sock)
        assert st["leaving"] == []
        restarts = {nd["id"]: nd["restarts"] for nd in snapshot_nodes(st["tree"])}
        assert restarts["ProcessorSupervisor"] == 1, "the crash counts, once"
        assert restarts["processor_default_0"] == 1 and restarts["ProducerSupervisor"] == 0
        flag.unlink()
        _, log = daemon.communicate(timeout=240)
    assert daemon.returncode == 0, log[-5000:]
    assert_nothing_lost(short_tmp, n, log)


# long: not in the default run (pytest -m slow)
@pytest.mark.slow
def test_a_stage_that_does_not_finish_leaving_is_restarted_out(short_tmp: Path) -> None:
    """processor_default_1 is held in handle_message past shutdown_timeout while it
    leaves: the resize restarts it out as a crash would (one requeue, the new shape) and
    answers; nothing is lost, and only what the requeue took can run twice."""
    n = 3000
    flag, sock_path, daemon = held_pipeline(short_tmp, n, shutdown_timeout=3.0)
    sock = str(sock_path)
    with shown_if_failing(daemon):
        res = cli("scale", "processors", "1", "--socket", sock)
        assert res.returncode == 0 and "-> 1 processors" in res.stdout, res
        flag.unlink()
        restarts = {nd["id"]: nd["restarts"]
                    for nd in snapshot_nodes(one_processor_again(sock)["tree"])}
        # an operator-style restart: the cascade, not counted toward intensity (the
        # supervisor itself shows the restart of its children)
        assert restarts["processor_default_0"] == 1 and restarts["ProducerSupervisor"] == 0
        _, log = daemon.communicate(timeout=240)
    assert daemon.returncode == 0, log[-5000:]
    assert "processor_default_1 did not finish leaving within 3s" in log
    assert_nothing_lost(short_tmp, n, log)
