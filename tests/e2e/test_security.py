"""Security properties, each checked against the real thing (issue 8, item 4):

* nothing on the wire is pickled: no pickling module anywhere in the package, and the
  decoder turns a pickle (even one that would run code) into a refused frame or inert
  bytes;
* the runtime dir is 0700 and nothing in it (control and hub sockets, every stage's ZeroMQ
  socket, the metrics files) is open to group or others while a daemon runs;
* the daemon's tree listens on loopback (metrics) and unix sockets only, and the metrics
  listener defaults to 127.0.0.1;
* a password in a broker URL appears in no log line, no ``status``, no ``/metrics`` and
  no ``check`` output, although the daemon keeps failing to reach that broker and says so.
"""

from __future__ import annotations

import ast
import json
import signal
import stat
import subprocess
import urllib.request
from pathlib import Path

import msgpack
import psutil
import pytest
from offbroadway.stages.runtime.redact import mask_url, redact
from offbroadway.stages.wire import events as ev
from offbroadway.stages.wire import protocol
from offbroadway.supervision.tree import snapshot_nodes

from tests.conftest import REPO, start_daemon, wait_until
from tests.e2e.test_operations import cli, free_port, status
from tests.e2e.test_pipeline import make_config, write_spool

PACKAGE_DIRS = ("api", "daemon", "stages", "supervision")
#: modules that (un)pickle, or run arbitrary code from bytes, and the pickle entry points
#: of libraries we do use
PICKLING_MODULES = {"pickle", "_pickle", "cPickle", "cloudpickle", "dill", "shelve",
                    "marshal", "jsonpickle", "multiprocessing", "copyreg"}
PICKLING_NAMES = {"read_pickle", "to_pickle", "allow_pickle", "loads_pickle"}
SECRET = "Zq9obSecretPw7x"


# -- nothing pickled -----------------------------------------------------------------------

def pickling_uses(source: str, filename: str) -> list[str]:
    """Imports of pickling modules and uses of pickle entry points in one module."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Call) and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            func = node.func
            fname = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if fname in ("__import__", "import_module"):
                names = [node.args[0].value]
        elif isinstance(node, ast.Attribute) and node.attr in PICKLING_NAMES:
            found.append(f"{filename}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.keyword) and node.arg in PICKLING_NAMES:
            found.append(f"{filename}:{node.value.lineno}: {node.arg}=")
        for name in names:
            if name.split(".")[0] in PICKLING_MODULES:
                found.append(f"{filename}:{node.lineno}: import {name}")
    return found


def test_the_static_check_sees_pickling() -> None:
    """The checker itself must be able to fail."""
    bad = ("import pickle\nfrom multiprocessing import Queue\nimportlib.import_module('dill')\n"
           "df.to_pickle('x')\nnp.load(f, allow_pickle=True)\n")
    assert len(pickling_uses(bad, "bad.py")) == 5
    assert pickling_uses("import msgpack\nimport json\n", "ok.py") == []


def test_no_module_of_the_package_pickles() -> None:
    found = []
    for folder in PACKAGE_DIRS:
        for path in sorted((REPO / folder).rglob("*.py")):
            found += pickling_uses(path.read_text(), str(path.relative_to(REPO)))
    assert not found, "pickling in the package:\n" + "\n".join(found)


class _RunsCode:
    """Unpickling this creates ``path``: proof that something unpickled it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def test_the_decoder_never_runs_a_pickle(tmp_path: Path) -> None:
    import pickle

    marker = tmp_path / "unpickled"
    evil = pickle.dumps(_RunsCode(marker))
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        with pytest.raises(protocol.ProtocolError):
            protocol.decode(pickle.dumps(_RunsCode(marker), protocol=proto))
    # a well-formed frame carrying a pickle as message data: delivered as inert bytes
    frame = protocol.events(ev.encode_rows([[0, 1, "id", evil, {"p": evil}]]))
    message = protocol.to_messages(protocol.open_events(protocol.decode(frame)[3]))[0]
    assert message.data == evil and isinstance(message.data, bytes)
    assert message.metadata == {"p": evil}
    # msgpack's extension types stay opaque ExtType values, never a hook that decodes them
    ext = msgpack.packb([protocol.VERSION, protocol.EVENTS, None, "d", msgpack.packb(
        [ev.MSGPACK, 0, 1, ["id"], [msgpack.packb(msgpack.ExtType(42, evil))],
         msgpack.packb({})])])
    opened = protocol.to_messages(protocol.open_events(protocol.decode(ext)[3]))
    assert isinstance(opened[0].data, msgpack.ExtType)
    assert not marker.exists()


# -- private runtime dir, loopback-only listeners ------------------------------------------

def tree_pids(daemon: subprocess.Popen) -> list[int]:
    proc = psutil.Process(daemon.pid)
    return [proc.pid] + [c.pid for c in proc.children(recursive=True)]


def listening(pids: list[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every TCP socket in LISTEN state held by these pids."""
    out = []
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        out += [(pid, c.laddr.ip, c.laddr.port) for c in conns
                if c.status == psutil.CONN_LISTEN]
    return out


def test_metrics_listen_defaults_to_loopback(tmp_path: Path) -> None:
    from offbroadway.daemon.config.load import validate

    raw = {"pipeline": {"name": "p", "handler": "tests.e2e.handlers:Recorder"},
           "producer": {"source": "spool", "options": {"path": str(tmp_path)}}}
    listen = validate(raw).config.metrics.listen
    assert listen.rpartition(":")[0] == "127.0.0.1", listen


def test_runtime_dir_private_and_only_loopback_listeners_while_running(short_tmp: Path) -> None:
    write_spool(short_tmp / "spool", 2000, files=2)
    port = free_port()
    config = make_config(short_tmp, context={"slow": 0.002}, batchers={
        "even": {"batch_size": 50, "batch_timeout": 0.2},
        "odd": {"batch_size": 50, "batch_timeout": 0.2}})
    config.write_text(config.read_text().replace('listen = ""', f'listen = "127.0.0.1:{port}"'))
    run = short_tmp / "run"
    daemon = start_daemon(config)
    try:
        wait_until(lambda: (run / "control.sock").exists(), timeout=60, message="control.sock")
        tree = wait_until(lambda: (t := status(run / "control.sock")) and all(
            n["state"] == "running" for n in snapshot_nodes(t["tree"])
            if n["kind"] == "worker" and n["id"] != "terminator") and t, timeout=60,
            message="every stage running")
        # wait for this daemon's metrics files: every stage has flushed once
        stages = [n for n in snapshot_nodes(tree["tree"]) if n["kind"] == "worker" and n["pid"]]
        wait_until(lambda: len(list((run / "metrics").glob("counter_*.db"))) >= len(stages),
                   timeout=30, message="every stage's metrics files")
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()

        problems = []
        for d in (run, short_tmp / "state"):
            mode = stat.S_IMODE(d.stat().st_mode)
            if mode != 0o700:
                problems.append(f"{d}: dir mode {mode:o}, not 700")
        entries = sorted(run.rglob("*"))
        kinds = {"socket": 0, "file": 0}
        for p in entries:
            st = p.lstat()
            if stat.S_ISSOCK(st.st_mode):
                kinds["socket"] += 1
            elif stat.S_ISREG(st.st_mode):
                kinds["file"] += 1
            if st.st_mode & 0o077:
                problems.append(f"{p}: mode {stat.S_IMODE(st.st_mode):o} is open to group/others")
        # control, hub, and one ROUTER per producer, processor and batcher; metrics files
        assert kinds["socket"] >= 6 and kinds["file"] >= len(stages), (kinds, entries)
        assert not problems, "\n".join(problems)

        pids = tree_pids(daemon)
        assert len(pids) >= len(stages) + 1
        listeners = listening(pids)
        assert {(ip, p) for _, ip, p in listeners} == {("127.0.0.1", port)}, listeners
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)


# -- secrets masked --------------------------------------------------------------------------

def test_mask_url_and_redact() -> None:
    cases = {
        f"amqp://ingest:{SECRET}@mq:5672/%2F": "amqp://ingest:***@mq:5672/%2F",
        f"redis://:{SECRET}@cache:6379/0": "redis://:***@cache:6379/0",
        f"redis://cache:6379/0?password={SECRET}&db=1": "redis://cache:6379/0?password=***&db=1",
        f"sc://spark:15002/;token={SECRET};user_id=me": "sc://spark:15002/;token=***;user_id=me",
        f"unix:///run/redis.sock?password={SECRET}": "unix:///run/redis.sock?password=***",
        f"amqp://u:{SECRET}@[::1/": "<unparsable url>",
        "amqp://guest@mq/": "amqp://guest@mq/",
    }
    for url, masked in cases.items():
        assert mask_url(url) == masked
    url = f"amqp://u:{SECRET}%21@mq/"
    assert SECRET not in redact(f"cannot reach {url} (password {SECRET}!)", url)


def secret_config(tmp: Path, source: str, url: str, metrics_port: int) -> Path:
    options = ({"url": url, "queue": "obtest-never-there", "backoff_max": 0.5}
               if source == "rabbitmq" else
               {"url": url, "stream": "obtest-never-there", "backoff_max": 0.5})
    config = make_config(tmp, source=source, handler="tests.e2e.handlers:NoBatch",
                         options=options)
    config.write_text(config.read_text().replace('listen = ""',
                                                 f'listen = "127.0.0.1:{metrics_port}"'))
    return config


@pytest.mark.parametrize("source,url", [
    ("rabbitmq", f"amqp://obuser:{SECRET}@127.0.0.1:{{port}}/%2F"),
    ("redis", f"redis://obuser:{SECRET}@127.0.0.1:{{port}}/0"),
])
def test_a_password_in_the_source_url_is_never_shown(short_tmp: Path, source: str,
                                                    url: str) -> None:
    pytest.importorskip("pika" if source == "rabbitmq" else "redis")
    url = url.format(port=free_port())          # nothing listens there: retried forever
    metrics_port = free_port()
    config = secret_config(short_tmp, source, url, metrics_port)
    sock = short_tmp / "run" / "control.sock"
    shown: dict[str, str] = {}
    check = cli("check", str(config))
    assert check.returncode == 0, check.stderr
    shown["check"] = check.stdout + check.stderr
    daemon = start_daemon(config)
    try:
        wait_until(lambda: sock.exists(), timeout=60, message="control.sock")

        def producer_source() -> dict | None:
            tree = status(sock)["tree"]
            node = next((n for n in snapshot_nodes(tree) if n["id"] == "producer_0"), None)
            src = ((node or {}).get("messages") or {}).get("source") or {}
            return src if src.get("last_error") else None

        src = wait_until(producer_source, timeout=60, interval=0.2,
                         message="the source reporting its connection error")
        assert src["url"] == mask_url(url) and "***" in src["url"]
        shown["status"] = cli("status", "--json", "--socket", str(sock)).stdout
        shown["status text"] = cli("status", "--socket", str(sock)).stdout
        shown["metrics"] = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                                  timeout=10).read().decode()
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            out, err = daemon.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            out, err = daemon.communicate()
    shown["stdout"], shown["stderr"] = out, err
    # the daemon did talk about the broker it cannot reach, with the URL masked
    assert mask_url(url) in err, err[-3000:]
    leaks = [where for where, text in shown.items() if SECRET in text]
    assert not leaks, f"the password appears in: {leaks}"
    assert json.loads(shown["status"])["tree"]


def test_check_masks_the_url_of_a_bad_source_option(short_tmp: Path) -> None:
    pytest.importorskip("pika")
    config = make_config(short_tmp, source="rabbitmq", handler="tests.e2e.handlers:NoBatch",
                         options={"url": f"http://obuser:{SECRET}@127.0.0.1:1/", "queue": "q"})
    proc = cli("check", str(config))
    assert proc.returncode == 2
    assert "url" in proc.stderr and "obuser:***@" in proc.stderr, proc.stderr
    assert SECRET not in proc.stdout + proc.stderr


def test_check_masks_a_bad_spark_remote(short_tmp: Path) -> None:
    config = make_config(short_tmp, batchers={"default": {"batch_size": 10}})
    config.write_text(config.read_text() + f'\n[spark]\noutput = "{short_tmp / "o"}"\n'
                      f'remote = "grpc://obuser:{SECRET}@127.0.0.1:1"\n')
    proc = cli("check", str(config))
    assert proc.returncode == 2
    assert SECRET not in proc.stdout + proc.stderr, proc.stderr
