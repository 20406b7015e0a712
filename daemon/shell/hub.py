"""The daemon's side of the stage control plane: one ROUTER every stage connects to.

Stages report and the daemon commands, in the vocabulary of :mod:`offbroadway.stages.wire.commands`
(both sides import it).  Frames are the same msgpack protocol as the data plane; a report
that is not of the vocabulary is counted and dropped like a malformed frame.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Callable

import zmq
import zmq.asyncio
from offbroadway.stages.runtime.spec import HUB, endpoint
from offbroadway.stages.wire import commands, protocol

log = logging.getLogger("offbroadway.daemon.shell.hub")

OnReport = Callable[[str, commands.Report], None]


class Hub:
    def __init__(self, runtime_dir: str, on_report: OnReport) -> None:
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self.sock.setsockopt(zmq.LINGER, 0)
        path = endpoint(runtime_dir, HUB)
        if os.path.exists(path[6:]):
            os.unlink(path[6:])
        self.sock.bind(path)
        os.chmod(path[6:], 0o600)
        self.on_report = on_report
        self.malformed = 0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        while True:
            parts = await self.sock.recv_multipart()
            if len(parts) != 2:
                self.malformed += 1
                continue
            ident, frame = parts
            try:
                msg = protocol.decode(frame)
            except protocol.ProtocolError as exc:
                self.malformed += 1
                log.warning("hub: dropped malformed frame from %r: %s", ident, exc)
                continue
            if msg[0] != protocol.REPORT:
                continue
            try:
                report = commands.parse_report(msg[1], msg[2])
            except commands.BadCommand as exc:
                self.malformed += 1
                log.warning("hub: dropped a report from %r: %s", ident, exc)
                continue
            try:
                self.on_report(ident.decode(), report)
            except Exception:
                log.exception("hub: handling report %r from %r failed", msg[1], ident)

    def send(self, stage_id: str, command: commands.Command) -> bool:
        """Send a command; False if the stage is not connected (it is down or starting)."""
        # An asyncio socket reports a NOBLOCK send's failure in the future it returns,
        # already completed, rather than by raising.
        fut = self.sock.send_multipart([stage_id.encode(), command.encode()], zmq.NOBLOCK)
        return not (fut.done() and fut.exception() is not None)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.sock.close(0)
        self.ctx.term()
