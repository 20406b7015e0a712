"""The daemon's hub over real ZeroMQ sockets: a stage's last report, sent as it exits and
still unread when its successor connects, is read under that stage's name.

Under one routing id per stage (before), the ROUTER handed the id over to the new
connection and renamed the old one: the old incarnation's last report, the acks it made
since its last tick, came in under a name libzmq made up and left the books (a summary
that said 330 of 400 acked after a run again)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import zmq
from offbroadway.daemon.shell.hub import Hub
from offbroadway.stages.runtime.spec import HUB, endpoint, hub_identity, hub_stage
from offbroadway.stages.wire import commands, protocol


def _incarnation(address: str, stage: str, pid: int) -> tuple[zmq.Context, zmq.Socket]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, hub_identity(stage, pid))
    sock.setsockopt(zmq.LINGER, 1000)
    sock.connect(address)
    return ctx, sock


def test_an_exited_incarnation_s_last_report_counts_under_its_stage(tmp_path: Path) -> None:
    async def scenario() -> list[tuple[str, commands.Report]]:
        got: list[tuple[str, commands.Report]] = []
        hub = Hub(str(tmp_path), lambda stage, report: got.append((stage, report)))
        address = endpoint(str(tmp_path), HUB)
        # the first incarnation says hello, reports its last figures and exits: ending
        # its context waits until the frames are in the hub's socket
        ctx, old = _incarnation(address, "producer_0", 111)
        old.send(commands.Hello(111).encode())
        old.send(commands.Stats({"pid": 111, "acked": 70}).encode())
        old.close()
        ctx.term()
        # its successor connects and says hello before the hub has read anything
        ctx2, new = _incarnation(address, "producer_0", 222)
        new.send(commands.Hello(222).encode())
        hub.start()
        deadline = asyncio.get_running_loop().time() + 10
        while len(got) < 3 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        # commands go to the incarnation that said hello last
        assert hub.send("producer_0", commands.LogLevel("debug"))
        assert new.poll(5000), "the command did not reach the new incarnation"
        assert commands.parse_command(*_command(new.recv())) == commands.LogLevel("debug")
        assert not hub.send("producer_9", commands.LogLevel("debug"))
        hub.close()
        new.close(0)
        ctx2.term()
        return got

    got = asyncio.run(scenario())
    stats = [(stage, r.stats) for stage, r in got if isinstance(r, commands.Stats)]
    assert stats == [("producer_0", {"pid": 111, "acked": 70})], got
    assert sorted(r.pid for s, r in got if isinstance(r, commands.Hello)) == [111, 222]
    assert {s for s, _ in got} == {"producer_0"}


def _command(frame: bytes) -> tuple[str, dict]:
    msg = protocol.decode(frame)
    return msg[protocol.COMMAND_NAME], msg[protocol.COMMAND_ARGS]


def test_a_routing_id_libzmq_made_up_names_no_stage() -> None:
    assert hub_stage(hub_identity("batch_processor_default_1", os.getpid())) == \
        "batch_processor_default_1"
    assert hub_stage(b"\x00k\x8bEg") == ""
    assert hub_stage(b"producer_0") == ""
