"""The daemon's side of the stage control plane: one ROUTER every stage connects to.

Stages report and the daemon commands, in the vocabulary of :mod:`offbroadway.stages.wire.commands`
(both sides import it).  Frames are the same msgpack protocol as the data plane; a report
that is not of the vocabulary is counted and dropped like a malformed frame.

Each incarnation of a stage connects under a routing id of its own (the stage id and its
pid: :func:`~offbroadway.stages.runtime.spec.hub_identity`), so the last report of one
that just exited is read under its own name even when its successor is already connected;
commands go to the incarnation that said hello last.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Callable

import zmq
import zmq.asyncio
from offbroadway.stages.runtime.spec import HUB, endpoint, hub_stage
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
        #: stage id -> the routing id of its incarnation that said hello last
        self.routes: dict[str, bytes] = {}
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
            stage = hub_stage(ident)
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
            if not stage:
                self.malformed += 1
                log.warning("hub: dropped a %s report from %r, not a stage's routing id",
                            msg[1], ident)
                continue
            if isinstance(report, commands.Hello) or stage not in self.routes:
                self.routes[stage] = ident
            try:
                self.on_report(stage, report)
            except Exception:
                log.exception("hub: handling report %r from %r failed", msg[1], ident)

    def send(self, stage_id: str, command: commands.Command) -> bool:
        """Send a command; False if the stage is not connected (it is down or starting)."""
        ident = self.routes.get(stage_id)
        if ident is None:
            return False
        # An asyncio socket reports a NOBLOCK send's failure in the future it returns,
        # already completed, rather than by raising.
        fut = self.sock.send_multipart([ident, command.encode()], zmq.NOBLOCK)
        return not (fut.done() and fut.exception() is not None)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.sock.close(0)
        self.ctx.term()
