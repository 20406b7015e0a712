"""The loop every stage process runs: sockets, timers, heartbeats, reports, signals.

A stage is a single-threaded ``zmq.Poller`` loop.  Role modules (producer, processor,
batcher, batch processor) register their sockets and timers here and implement the frame
handlers; this module owns what they share: the hub connection to the daemon, the
supervisor heartbeat, periodic stats, reading and decoding an upstream's frames (counting
and dropping malformed ones), and a clean exit on SIGTERM.

Signals: SIGINT is ignored (a terminal's Ctrl-C reaches the whole foreground process group,
and shutdown is the daemon's to drive); SIGTERM from the supervisor ends the loop at once:
the signal's byte lands on a wake-up socket (``signal.set_wakeup_fd``) that the poller
watches, so the loop returns from ``poll`` instead of sleeping out its timeout (pyzmq
retries an interrupted poll after running the Python handler).  The supervisor stops the
stages one by one in reverse start order, so every poll timeout waited out there would
add up in the daemon's stop.

Sockets.  Every socket a stage has, and the poller that watches them, come from one
object, its :class:`ZmqIO`: the stage and its role only ever call ``send``, ``recv`` and
friends on what it hands out.  A unit test hands the stage another such object (fake
sockets that keep what is sent and give back what the test queued), so producer,
processor, batcher and batch processor are built and driven frame by frame without
ZeroMQ, and what they decide is tested apart from the loop that wires it to the OS.
"""

from __future__ import annotations

import heapq
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import zmq
from offbroadway.supervision import child

from ..wire import commands, protocol
from .failures import FailureTally
from .metrics import StageMetrics
from .spec import HUB, StageSpec, endpoint, hub_identity
from .tally import NO_TALLY, Tally
from .tally import path as tally_path

log = logging.getLogger("offbroadway.stage")

#: reports that carry the stage's figures (the tally keeps them too)
_FIGURES = (commands.Stats, commands.Done, commands.Settled, commands.Left)

Handler = Callable[[bytes, list], None]


class StageExit(Exception):
    """Raised inside the loop to end it cleanly (exit code 0)."""


class ZmqIO:
    """A stage's sockets and poller: the one place a stage touches ZeroMQ's context."""

    def __init__(self) -> None:
        self.ctx = zmq.Context.instance()
        self.poller = zmq.Poller()

    def hub(self, identity: bytes, address: str) -> zmq.Socket:
        """The DEALER to the daemon's hub (reports out, commands in)."""
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, identity)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.connect(address)
        return sock

    def router(self, address: str) -> zmq.Socket:
        """Bind a ROUTER at ``address`` (``ipc://``), private to this user.

        ROUTER_MANDATORY turns a send to a vanished peer into an error instead of a silent
        drop (ARCHITECTURE §11); ROUTER_HANDOVER lets a restarted consumer, which keeps
        its routing id, take over its old connection.
        """
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        sock.setsockopt(zmq.SNDHWM, 0)   # demand already bounds what is sent
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.LINGER, 0)
        fs_path = address[len("ipc://"):]
        if os.path.exists(fs_path):
            os.unlink(fs_path)   # a previous incarnation's leftover
        # 0600 like the control and hub sockets: the runtime dir is private already, but a
        # socket that anyone could connect to must not depend on that alone
        old = os.umask(0o177)
        try:
            sock.bind(address)
        finally:
            os.umask(old)
        os.chmod(fs_path, 0o600)
        return sock

    def dealer(self, identity: bytes, address: str) -> zmq.Socket:
        """A DEALER connected to an upstream stage's ROUTER under ``identity``."""
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, identity)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        return sock

    def watch(self, sock_or_fd: zmq.Socket | int) -> None:
        self.poller.register(sock_or_fd, zmq.POLLIN)

    def unwatch(self, sock: zmq.Socket) -> None:
        self.poller.unregister(sock)

    def poll(self, timeout_ms: float) -> list:
        return self.poller.poll(timeout_ms)

    def readable(self, socks: list[zmq.Socket], timeout: float) -> list[zmq.Socket]:
        """Which of ``socks`` have a frame, waiting up to ``timeout`` seconds."""
        return zmq.select(socks, [], [], timeout)[0]

    def destroy(self, linger_ms: int) -> None:
        """Close every socket, waiting up to ``linger_ms`` for queued frames to leave."""
        self.ctx.destroy(linger=linger_ms)

    def close(self) -> None:
        """Close every socket with its own linger (the data sockets' 0, the hub's 1 s) and
        end the context, which waits for that linger: so a stage's last reports leave
        before its process does.  Left to the interpreter's exit, they may not: pyzmq
        does not end the context then, and the process's end takes the I/O thread, and
        any frame it had not written yet, with it."""
        self.ctx.destroy(linger=None)


class Stage:
    #: How often the loop beats and reports even when idle.
    TICK = 1.0
    #: Frames read from one upstream socket per wake-up (:meth:`frames`) before the loop
    #: turns to the stage's other sockets and timers.  100 frames of events are 100 cheap
    #: hand-offs (into an inbox, or regrouped unopened), and a frame's cost is the budget
    #: (ARCHITECTURE §11): reading a burst per wake-up is what keeps the poll per frame
    #: low.  A role whose frames are each a long job says less (the batch processor).
    UPSTREAM_BURST = 100
    #: milliseconds a stage that left the pipeline waits at exit for its last frames
    #: (acks, events, the final cancels) to reach their peers' sockets
    LEAVE_LINGER_MS = 10_000

    def __init__(self, spec: StageSpec, io: ZmqIO | None = None) -> None:
        self.spec = spec
        self.id = spec.id
        #: every socket and the poller (a unit test passes fakes: see :class:`ZmqIO`)
        self.io = io if io is not None else ZmqIO()
        self._handlers: dict[zmq.Socket, Callable[[zmq.Socket], None]] = {}
        self._fd_handlers: dict[int, Callable[[], None]] = {}
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._timer_seq = 0
        self.running = True
        #: a resize removes this stage: it finishes what it holds, then the supervisor
        #: stops it (see :meth:`_flush_on_exit`)
        self.leaving = False
        self.counters: dict[str, int] = {"in": 0, "out": 0, "failed": 0, "acked": 0,
                                         "malformed": 0}
        self.metrics = StageMetrics(spec.pipeline, spec.id, spec.role)
        #: reasons of the messages this stage failed, one WARNING per interval (not per
        #: message); its acker adds to it
        self.failures = FailureTally()
        self.hub = self.io.hub(hub_identity(self.id, os.getpid()),
                              endpoint(spec.runtime_dir, HUB))
        self.register(self.hub, self._on_hub)
        #: the daemon's commands this stage takes (:mod:`.commands`), by record type
        self._commands: dict[type[commands.Command], Callable[[Any], None]] = {}
        self.accept(commands.LogLevel, self._on_log_level)
        #: the counts the daemon's books read, in a file that outlives a SIGKILL
        #: (:mod:`.tally`); opened by :meth:`run`, a no-op in a stage that is not run
        self.tally: Tally = NO_TALLY

    # -- wiring -----------------------------------------------------------------------------
    def register(self, sock: zmq.Socket, on_readable: Callable[[zmq.Socket], None]) -> None:
        self.io.watch(sock)
        self._handlers[sock] = on_readable

    def unregister(self, sock: zmq.Socket) -> None:
        """Stop watching ``sock`` and close it (an upstream that left the pipeline)."""
        self.io.unwatch(sock)
        self._handlers.pop(sock, None)
        sock.close(0)

    def register_fd(self, fd: int, on_readable: Callable[[], None]) -> None:
        self.io.watch(fd)
        self._fd_handlers[fd] = on_readable

    def call_at(self, when: float, fn: Callable[[], None]) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (when, self._timer_seq, fn))

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        self.call_at(time.monotonic() + delay, fn)

    def router(self) -> zmq.Socket:
        """Bind this stage's ROUTER, for the consumers that subscribe to it."""
        return self.io.router(self.spec.socket_path())

    def dealer(self, stage_id: str) -> zmq.Socket:
        """Connect to an upstream stage's ROUTER under this stage's routing id."""
        return self.io.dealer(self.id.encode(), endpoint(self.spec.runtime_dir, stage_id))

    # -- frames -----------------------------------------------------------------------------
    def decode(self, frame: bytes, peer: str) -> list | None:
        """Decode or count-and-drop: a bad frame never crashes a stage."""
        try:
            return protocol.decode(frame)
        except protocol.ProtocolError as exc:
            self.counters["malformed"] += 1
            n = self.counters["malformed"]
            if n <= 10 or n % 1000 == 0:
                log.warning("%s: dropped malformed frame #%d from %s: %s", self.id, n, peer, exc)
            return None

    def accept(self, command: type[commands.Command],
               handler: Callable[[Any], None]) -> None:
        """Take ``command`` from the daemon: ``handler(record)`` runs on it."""
        self._commands[command] = handler

    def report(self, report: commands.Report) -> None:
        if isinstance(report, _FIGURES):
            self.tally.write(report.stats)
        self.hub.send(report.encode(), zmq.NOBLOCK)

    def frames(self, sock: zmq.Socket, peer: str) -> Iterator[list]:
        """The decoded frames waiting on an upstream socket, at most
        :attr:`UPSTREAM_BURST` of them (a malformed one counts, and is dropped by
        :meth:`decode`).  Readiness comes from the socket's ``EVENTS``, so the read ends
        without a ``zmq.Again`` raised per wake-up; the poller is level-triggered, so what
        is left past the burst wakes the loop again."""
        for _ in range(self.UPSTREAM_BURST):
            if not sock.get(protocol.ZMQ_EVENTS) & protocol.ZMQ_POLLIN:
                return
            msg = self.decode(sock.recv(zmq.NOBLOCK), peer)
            if msg is not None:
                yield msg

    def _on_hub(self, sock: zmq.Socket) -> None:
        while True:
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            msg = self.decode(frame, "hub")
            if msg is None or msg[protocol.KIND_AT] != protocol.COMMAND:
                continue
            try:
                command = commands.parse_command(msg[protocol.COMMAND_NAME],
                                                 msg[protocol.COMMAND_ARGS])
            except commands.BadCommand as exc:
                # a daemon of another version must not kill the stage (a TypeError inside
                # a handler is a bug and does)
                log.warning("%s: command ignored: %s", self.id, exc)
                continue
            handler = self._commands.get(type(command))
            if handler is None:
                log.warning("%s: command %r is not for a %s", self.id, command.NAME,
                            self.spec.role)
                continue
            handler(command)

    def _on_log_level(self, command: commands.LogLevel) -> None:
        """A reload changed ``runtime.log_level``."""
        level = command.level.upper()
        logging.getLogger().setLevel(level)
        # said at the new level itself: it shows only if the new level is in force
        log.log(logging.getLevelName(level), "%s: log level %s (reload)", self.id,
                command.level)

    # -- the loop ---------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        return {**self.counters, "pid": os.getpid()}

    def _tick(self) -> None:
        child.heartbeat()
        self._log_failures()
        stats = self.stats()
        self._flush_metrics(stats)
        try:
            self.report(commands.Stats(stats))
        except zmq.Again:
            pass
        self.call_later(self.TICK, self._tick)

    def _flush_metrics(self, stats: dict[str, Any]) -> None:
        """Publish the metrics, and say so in the tally: the daemon publishes for a dead
        stage what it counted since (:mod:`.tally`)."""
        self.metrics.flush(self.counters, stats)
        self.tally.flushed(self.counters)

    def _log_failures(self, final: bool = False) -> None:
        line = self.failures.line(float("inf") if final else time.monotonic(), self.id)
        if line is not None:
            log.warning("%s", line)

    def setup(self) -> None:
        """Role-specific start: bind, subscribe, open the source.  Ready after this."""

    def teardown(self) -> None:
        """Role-specific cleanup on exit."""

    def _install_signals(self) -> None:
        """SIGTERM ends the loop; its wake-up byte makes the poller return at once."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "running", False))
        rsock, wsock = socket.socketpair()
        rsock.setblocking(False)
        wsock.setblocking(False)
        self._wakeup = (rsock, wsock)      # kept: closing either would break the wake-up
        signal.set_wakeup_fd(wsock.fileno(), warn_on_full_buffer=False)
        self.register_fd(rsock.fileno(), self._on_wakeup)

    def _on_wakeup(self) -> None:
        # the bytes only wake the poller; the Python handler already ran (or runs now)
        try:
            while self._wakeup[0].recv(512):
                pass
        except BlockingIOError:
            pass

    def run(self) -> int:
        self._install_signals()
        try:
            self.tally = Tally(tally_path(self.spec.runtime_dir, self.id), os.getpid())
        except OSError as exc:
            log.warning("%s: no tally file (%s): a SIGKILL loses the counts since the last "
                        "report", self.id, exc)
        self.setup()
        self.report(commands.Hello(os.getpid()))
        child.notify_ready()
        self._tick()
        handlers, fd_handlers, timers = self._handlers, self._fd_handlers, self._timers
        poll = self.io.poll
        try:
            while self.running:
                timeout = 200.0
                if timers:
                    timeout = max(0.0, min(timeout, (timers[0][0] - time.monotonic()) * 1000))
                for sock, _ in poll(timeout):
                    if isinstance(sock, int):
                        fd_handlers[sock]()
                    else:
                        fn = handlers.get(sock)
                        if fn is not None:    # None: unregistered by an earlier handler
                            fn(sock)
                now = time.monotonic()
                while timers and timers[0][0] <= now:
                    heapq.heappop(timers)[2]()
        except StageExit:
            pass
        finally:
            self._log_failures(final=True)    # what failed since the last line
            # what happened since the last tick: a stage stopped within a second of its
            # last work (an operator restart, a resize, a stop) would lose it from /metrics
            self._flush_metrics(self.stats())
            self.teardown()
            self._report_last()
            if self.leaving:
                self._flush_on_exit()
            else:
                self.io.close()
        return 0

    def _report_last(self) -> None:
        """The figures as they end, after the teardown (a producer's source has applied
        its last acks): the daemon's books would otherwise keep the last tick's, up to a
        second old, for a stage stopped right after its last work (a restart, a run
        again).  The hub socket lingers and :meth:`ZmqIO.close` waits for it, so the report
        leaves before the process does."""
        try:
            self.report(commands.Stats(self.stats()))
        except zmq.ZMQError:
            pass

    def _flush_on_exit(self) -> None:
        """A stage that left the pipeline reported ``left`` once it had *sent* everything;
        its data sockets linger 0 (at a stop the drain's fences say what arrived), so here
        they are closed with a linger and the context waits until its I/O threads have
        written every queued frame, bounded by :data:`LEAVE_LINGER_MS`.  The supervisor's
        stop returns when we exit: by then the frames are in the peers' sockets."""
        self.io.destroy(self.LEAVE_LINGER_MS)   # every socket of the context

