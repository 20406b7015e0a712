"""No secret on any line: a scripted run with a distinctive password in the broker URL and
in a source option named ``password``, through everything an operator does (start, status,
a reload refused and one accepted, a restart, a scale, a kill, a stop) and a broker that
refuses the password.  Every byte the run produced on every surface (stdout and stderr of
the daemon and of every command, ``status --json``, ``/metrics``, ``/api/state``, the page
and its event stream, what the daemon tells systemd (``STATUS=``, through a notify socket
of the test's own), the command lines of the daemon and its stages (the journal's
``_CMDLINE``), the files the daemon wrote) is searched, and the password appears nowhere.

The password is real: a RabbitMQ user of this test's own, removed at the end.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import urllib.request
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.brokers.conftest import unique
from tests.conftest import REPO, free_port, offbroadway_cmd, test_env, wait_until

pytestmark = pytest.mark.broker

SOURCE = "tests.brokers.secret_source:PasswordRabbitMQ"


def rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture
def broker_user():
    """A user of this test's own with a password no other text contains."""
    user = unique("user")
    password = f"Zebra-{uuid.uuid4().hex[:12]}-Quux"
    rabbitmqctl("add_user", user, password)
    try:
        rabbitmqctl("set_permissions", "-p", "/", user, ".*", ".*", ".*")
        yield user, password
    finally:
        subprocess.run(["rabbitmqctl", "-q", "delete_user", user], capture_output=True,
                       timeout=60, check=False)


def config_text(tmp: Path, *, user: str, password: str, queue: str, port: int,
                batch_size: int = 10, url_password: str | None = None) -> str:
    url_pw = quote(url_password if url_password is not None else password, safe="")
    return f"""
[pipeline]
name = "secrets"
handler = "tests.brokers.handlers:JsonBody"
shutdown_timeout = 10
context = {{ out = "{tmp / 'out'}" }}

[producer]
source = "{SOURCE}"

[producer.options]
url = "amqp://{user}:{url_pw}@127.0.0.1:5672/%2F"
password = "{password}"
queue = "{queue}"

[processors.default]
concurrency = 2

[batchers.default]
batch_size = {batch_size}
batch_timeout = 0.2

[metrics]
listen = "127.0.0.1:{port}"

[runtime]
dir = "{tmp / 'run'}"
state_dir = "{tmp / 'state'}"
"""


def cli(*args: str, env: dict[str, str] | None = None) -> str:
    """A command's every byte (stdout and stderr), whatever its exit code."""
    res = subprocess.run(offbroadway_cmd(*args), cwd=REPO, env={**test_env(), **(env or {})},
                         capture_output=True, text=True, timeout=90)
    return f"$ {' '.join(args)} -> {res.returncode}\n{res.stdout}{res.stderr}"


def get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return r.read().decode("utf-8", "replace")


def walk(node: dict):
    yield node
    for child in node.get("children", []):
        yield from walk(child)


def files_under(*dirs: Path) -> str:
    out = []
    for d in dirs:
        for root, _dirs, names in os.walk(d):
            for name in names:
                path = os.path.join(root, name)
                try:
                    with open(path, "rb") as f:
                        out.append(f.read().decode("utf-8", "replace"))
                except OSError:
                    pass       # a socket
    return "\n".join(out)


def events(port: int, count: int = 2) -> str:
    """The first ``count`` events of the page's stream (``/api/events``)."""
    out: list[str] = []
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/events", timeout=10) as r:
        while sum(1 for ln in out if ln.startswith("data:")) < count:
            line = r.readline().decode("utf-8", "replace")
            if not line:
                break
            out.append(line)
    return "".join(out)


def cmdlines(status: dict) -> str:
    """The command lines of the daemon and of every stage in a ``status --json`` tree."""
    pids = [status.get("pid")] + [n.get("pid") for n in walk(status["tree"])]
    out = []
    for pid in filter(None, pids):
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                       .decode("utf-8", "replace"))
        except OSError:
            pass
    return "\n".join(out)


class NotifySocket:
    """A stand-in for systemd's notify socket: every datagram the daemon sends to it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.got: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                self.got.append(self.sock.recv(65536).decode("utf-8", "replace"))
            except TimeoutError:
                continue
            except OSError:
                return

    def close(self) -> str:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()
        return "\n".join(self.got)


def test_the_password_appears_on_no_surface(short_tmp: Path, rabbit, broker_user) -> None:
    user, password = broker_user
    queue = rabbit.queue()
    (short_tmp / "out").mkdir()
    port = free_port()
    config = short_tmp / "pipeline.toml"
    config.write_text(config_text(short_tmp, user=user, password=password, queue=queue,
                                  port=port))
    cfg = str(config)
    seen: list[str] = [cli("check", cfg)]
    log = open(short_tmp / "daemon.log", "w+")
    notify = NotifySocket(short_tmp / "notify.sock")
    daemon = subprocess.Popen(offbroadway_cmd("run", cfg), cwd=REPO,
                              env={**test_env(), "NOTIFY_SOCKET": str(notify.path)},
                              stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        sock = ["--config", cfg]
        wait_until(lambda: '"running"' in cli("status", "--json", *sock), timeout=60,
                   message="daemon up")
        rabbit.publish(queue, 50)
        wait_until(lambda: json.loads(cli("status", "--json", *sock).split("\n", 1)[1]
                                      ).get("acked", 0) >= 50, timeout=60,
                   message="50 acked")
        seen += [cli("status", *sock), cli("status", "--json", *sock)]
        stream = events(port)
        lines = cmdlines(json.loads(cli("status", "--json", *sock).split("\n", 1)[1]))
        assert stream.count("data:") == 2 and "producer_0" in stream, stream[:2000]
        assert lines.count("offbroadway") >= 6, lines    # the daemon and its stages
        seen += [get(port, "/metrics"), get(port, "/api/state"), get(port, "/"), stream,
                 lines]
        # a reload that cannot apply: the queue changed (and the password option with it)
        config.write_text(config_text(short_tmp, user=user, password=password + "x",
                                      queue=queue + "-other", port=port,
                                      url_password=password))
        refused = cli("reload", *sock)
        assert "producer.options.queue" in refused, refused
        seen.append(refused)
        # one that applies
        config.write_text(config_text(short_tmp, user=user, password=password, queue=queue,
                                      port=port, batch_size=20))
        accepted = cli("reload", *sock)
        assert "batch_size" in accepted, accepted
        seen += [accepted, cli("restart", "producer_0", *sock),
                 cli("scale", "processors", "3", *sock)]
        def kill_processor() -> bool:
            status = json.loads(cli("status", "--json", *sock).split("\n", 1)[1])
            victim = next(n for n in walk(status["tree"]) if n["id"] == "processor_default_0")
            if victim.get("state") != "running" or not victim.get("pid"):
                return False     # the scale's or the restart's cascade still under way
            try:
                os.kill(victim["pid"], signal.SIGKILL)
            except ProcessLookupError:
                return False
            return True

        wait_until(kill_processor, timeout=30, interval=0.1, message="a processor killed")
        rabbit.publish(queue, 50, start=50)
        wait_until(lambda: json.loads(cli("status", "--json", *sock).split("\n", 1)[1]
                                      ).get("acked", 0) >= 100, timeout=60,
                   message="100 acked after the kill")
        seen += [cli("status", "--json", *sock), get(port, "/metrics"),
                 get(port, "/api/state"), cli("top", "--once", *sock)]
        seen.append(cli("stop", *sock))
        assert daemon.wait(60) == 0
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(30)
        told = notify.close()
    assert "READY=1" in told and "STATUS=" in told, told[-2000:]
    seen.append(told)
    # a broker that refuses: the same password for a user it does not know
    refused_cfg = short_tmp / "refused.toml"
    refused_cfg.write_text(config_text(short_tmp, user=user + "-nobody", password=password,
                                       queue=queue, port=free_port()))
    notify = NotifySocket(short_tmp / "notify-refused.sock")
    seen += [cli("check", str(refused_cfg)),
             cli("run", str(refused_cfg), "--until-idle", env={"NOTIFY_SOCKET": str(notify.path)})]
    seen.append(notify.close())     # (a start refused says nothing to systemd but exits)
    log.seek(0)
    seen.append(log.read())
    seen.append(files_under(short_tmp / "run", short_tmp / "state", short_tmp / "out"))
    everything = "\n".join(seen)
    assert "producer_0" in everything and "reload refused" in everything   # it did run
    for secret in {password, quote(password, safe=""), password + "x"}:
        lines = [ln for ln in everything.splitlines() if secret in ln]
        assert not lines, f"{len(lines)} line(s) show the password, first: {lines[0][:400]}"
