"""Test-side NATS JetStream helpers: a synchronous client for set-up and inspection, and a
private nats-server (own port, own store) for tests that must restart the server.

The shared server (127.0.0.1:4222) is used with unique stream names that every test
deletes; only a test's own server is ever stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port, wait_until

nats = pytest.importorskip("nats", reason="the brokers extra (nats-py) is not installed")

NATS_URL = "nats://127.0.0.1:4222"
NATS_SERVER = shutil.which("nats-server") or "/usr/sbin/nats-server"


def unique(prefix: str) -> str:
    # stream names are subject tokens: no dots
    return f"obtest-{prefix}-{uuid.uuid4().hex[:10]}"


class Jet:
    """A synchronous JetStream client on its own event loop (nats-py is asyncio-only)."""

    def __init__(self, url: str = NATS_URL) -> None:
        self.url = url
        self.loop = asyncio.new_event_loop()
        try:
            self.nc = self.run(nats.connect(url, connect_timeout=3, max_reconnect_attempts=1,
                                            allow_reconnect=False))
        except Exception as exc:
            self.loop.close()
            pytest.fail(f"NATS is not answering at {url} ({exc}); start it with "
                        f"`start-stop-daemon --start --oknodo --background --exec "
                        f"{NATS_SERVER} -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server`")
        self.js = self.nc.jetstream()
        self.streams: list[str] = []

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def stream(self, *, dead_letter: bool = False) -> str:
        """A fresh stream on subjects ``<name>.>``; with ``dead_letter`` also a stream
        ``<name>-dead`` capturing ``<name>-dead.>``."""
        name = unique("s")
        self.run(self.js.add_stream(name=name, subjects=[f"{name}.>"]))
        self.streams.append(name)
        if dead_letter:
            self.run(self.js.add_stream(name=f"{name}-dead", subjects=[f"{name}-dead.>"]))
            self.streams.append(f"{name}-dead")
        return name

    def publish(self, stream: str, bodies: list[bytes], *, start: int = 0) -> list[str]:
        """Publish with ``Nats-Msg-Id: m<i>``; returns the ids (confirmed by the stream)."""
        async def go() -> list[str]:
            ids = []
            futures = []
            for i, body in enumerate(bodies, start):
                ids.append(f"m{i}")
                futures.append(await self.js.publish_async(
                    f"{stream}.in", body, headers={"Nats-Msg-Id": f"m{i}"}))
                if len(futures) >= 2000:
                    await asyncio.gather(*futures)
                    futures = []
            await asyncio.gather(*futures)
            return ids
        return self.run(go())

    def consumer(self, stream: str, name: str) -> Any:
        return self.run(self.js.consumer_info(stream, name))

    def messages(self, stream: str) -> list[Any]:
        """Every message stored in a stream (an ordered ephemeral read, nothing acked)."""
        async def go() -> list[Any]:
            info = await self.js.stream_info(stream)
            out = []
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                if info.state.messages == 0:
                    break
                with contextlib.suppress(nats.js.errors.NotFoundError):
                    out.append(await self.js.get_msg(stream, seq))
            return out
        return self.run(go())

    def cleanup(self) -> None:
        for s in self.streams:
            with contextlib.suppress(Exception):
                self.run(self.js.delete_stream(s))
        with contextlib.suppress(Exception):
            self.run(self.nc.close())
        self.loop.close()


class NatsServer:
    """A nats-server of the test's own (free port, own store dir), to kill and restart."""

    def __init__(self, store: Path) -> None:
        self.store = store
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd",
             str(self.store), "-l", str(self.store / "server.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self._answers, timeout=30, interval=0.05, message="nats-server up")

    def _answers(self) -> bool:
        with socket.socket() as s:
            s.settimeout(0.5)
            try:
                s.connect(("127.0.0.1", self.port))
                return s.recv(4).startswith(b"INFO")
            except OSError:
                return False

    def kill(self) -> None:
        """SIGKILL: no goodbye to clients, the store as the crash left it."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
