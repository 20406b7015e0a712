"""The operator's control socket, the daemon's side: it listens on
``<runtime_dir>/control.sock`` (mode 0600), reads one JSON line per connection and
answers it with one, and drops hostile clients (silent, garbage, flooding) without
holding anything up.  The asking side and the socket's name are :mod:`..cli.control`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from typing import Awaitable, Callable

log = logging.getLogger("offbroadway.daemon.cli.control")

Handler = Callable[[dict], Awaitable[dict]]


#: a request line must arrive whole within this long: the CLI sends it at once
READ_TIMEOUT = 5.0
#: a reply the client does not read within this long is dropped with the connection
WRITE_TIMEOUT = 10.0
#: requests are a few dozen bytes; a longer line is garbage
MAX_REQUEST = 64 * 1024
#: connections still waiting for their request line; the next one evicts the oldest
#: (each holds a file descriptor: a client that opens thousands and sends nothing must
#: neither take them all nor keep an operator's command out)
MAX_WAITING = 64
#: at most one line per this many seconds about dropped clients
DROP_LOG_INTERVAL = 60.0
#: connections accepted per second at most, and in one burst (see :class:`_Server`)
ACCEPT_RATE = 100.0
ACCEPT_BURST = 20
#: once the tokens are spent, the queue is looked at again this often (not at each token
#: due): every wake-up of the daemon costs ~0.2 ms of CPU here whatever it does, so
#: clients queued meanwhile are taken together (two a tick at the rate above)
ACCEPT_TICK = 0.02
#: verbs that change nothing, whose answer is shared by requests this close together
SHARED = frozenset({"status"})
SHARED_FOR = 0.2
#: distinct requests whose answers are kept at once
KEPT_MOST = 16


class _Drops:
    """Counts clients dropped (silent, garbage, evicted) and says so at most once per
    :data:`DROP_LOG_INTERVAL`: a hostile client must not flood the journal either."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._last_log = float("-inf")

    def drop(self, why: str) -> None:
        self.counts[why] = self.counts.get(why, 0) + 1
        now = time.monotonic()
        if now - self._last_log >= DROP_LOG_INTERVAL:
            self._last_log = now
            log.warning("control socket: clients dropped so far: %s",
                        ", ".join(f"{n} {w}" for w, n in sorted(self.counts.items())))


class _Answers:
    """Read-only answers shared by requests within :data:`SHARED_FOR` seconds.

    A ``status`` costs the daemon a millisecond or two of CPU (the tree, the board, /proc
    for each child, the JSON); a client asking 1,000 times a second would take a whole
    core from the loop that also runs the hub and the supervisors.  The stages report
    once a second, so an answer a fifth of a second old is as fresh as a new one; any
    other verb (a restart, a reload...) drops what is kept, so a ``status`` after it sees
    its effect."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[float, bytes]] = {}

    def kept(self, request: dict) -> bytes | None:
        """The answer kept for ``request`` if it is still fresh, else None."""
        if request.get("cmd") not in SHARED:
            return None
        kept = self._kept.get(json.dumps(request, sort_keys=True))
        if kept is not None and time.monotonic() - kept[0] < SHARED_FOR:
            return kept[1]
        return None

    async def answer(self, request: dict, handler: Handler) -> bytes:
        key = json.dumps(request, sort_keys=True) if request.get("cmd") in SHARED else None
        now = time.monotonic()
        if key is not None:
            kept = self.kept(request)
            if kept is not None:
                return kept
        else:
            self._kept.clear()
        try:
            reply = await handler(request)
        except Exception as exc:
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        data = json.dumps(reply).encode() + b"\n"
        if key is not None and reply.get("ok"):
            if len(self._kept) >= KEPT_MOST:      # a client varying its requests must not
                self._kept.clear()                # grow the daemon without bound
            self._kept[key] = (now, data)
        return data


async def serve(path: str, handler: Handler) -> _Server:
    """Serve ``path``; each connection is one request, read within :data:`READ_TIMEOUT`
    and answered within :data:`WRITE_TIMEOUT` (the handler itself may take as long as
    its command does, e.g. ``stop``).  A client that sends nothing, a line that is not a
    JSON object or is too long, or one that does not read its answer is answered with an
    error when it can be and closed; beyond :data:`MAX_WAITING` connections waiting for
    their line, each new one closes the oldest.  Nothing a client does holds up another
    client or the loop, and a flood of ``status`` costs one answer per
    :data:`SHARED_FOR` (:class:`_Answers`)."""
    if os.path.exists(path):
        os.unlink(path)
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)     # the socket is created 0600: only the service user may steer
    try:
        lsock.bind(path)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    lsock.listen(256)
    lsock.setblocking(False)
    return _Server(lsock, handler, asyncio.get_running_loop())


class _Server:
    """The control socket's listener and its connections, driven by the loop's reader
    and writer callbacks on the raw sockets.

    Why not asyncio's streams: a connection through them (a transport, a protocol, a
    stream reader and writer, a task, ``wait_for`` timers) cost the daemon about half a
    millisecond of CPU however cheap its answer, so 1,000 ``status`` calls a second took
    half a core from a two-core machine's pipeline (bench/neighbours.py).  Here a call
    answered from :class:`_Answers` is an accept, a ``recv``, a dictionary lookup, a
    ``send`` and a close, all in one callback when the line has already arrived.

    Accepting is paced at :data:`ACCEPT_RATE` a second (bursts of :data:`ACCEPT_BURST`):
    the rest wait in the kernel's queue, and their clients in ``connect``, costing nobody
    CPU; once the tokens are spent the queue is looked at once per :data:`ACCEPT_TICK`,
    and what queued meanwhile is taken in that one wake-up.  ``close()`` stops accepting
    (as asyncio's server); requests already read are still answered."""

    def __init__(self, lsock: socket.socket, handler: Handler,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._lsock = lsock
        self._handler = handler
        self._loop = loop
        self._drops = _Drops()
        self._answers = _Answers()
        #: connections still waiting for their line, the oldest first (dicts keep order)
        self._waiting: dict[_Conn, None] = {}
        self._tokens = float(ACCEPT_BURST)
        self._last = loop.time()
        self._paused: asyncio.TimerHandle | None = None
        self._open = True
        self._listening = False
        self._listen()

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        if self._paused is not None:
            self._paused.cancel()
        if self._listening:
            self._listening = False
            self._loop.remove_reader(self._lsock.fileno())
        self._lsock.close()

    # -- accepting -------------------------------------------------------------------

    def _on_accept(self) -> None:
        now = self._loop.time()
        self._tokens = min(float(ACCEPT_BURST), self._tokens + (now - self._last) * ACCEPT_RATE)
        self._last = now
        while self._tokens >= 1.0:
            try:
                sock, _ = self._lsock.accept()
            except (BlockingIOError, InterruptedError):
                self._listen()              # none waiting: the next one is taken at once
                return
            except OSError as exc:       # EMFILE and the like: try again in a moment
                log.warning("control socket: cannot accept: %s", exc.strerror or exc)
                break
            self._tokens -= 1.0
            self._admit(sock)
        # out of tokens (or fds): stop listening until the next tick; the kernel queues
        if self._listening:
            self._listening = False
            self._loop.remove_reader(self._lsock.fileno())
        self._paused = self._loop.call_later(
            max(ACCEPT_TICK, (1.0 - self._tokens) / ACCEPT_RATE), self._resume)

    def _listen(self) -> None:
        if not self._listening:
            self._listening = True
            self._loop.add_reader(self._lsock.fileno(), self._on_accept)

    def _resume(self) -> None:
        """A tick after the tokens ran out: take what queued meanwhile, in this wake-up."""
        self._paused = None
        if self._open:
            self._on_accept()

    def _admit(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        conn = _Conn(sock)
        if self._read(conn):                # the line is usually there already: answered
            return                          # without a reader or a timer for it
        if len(self._waiting) >= MAX_WAITING:
            oldest = next(iter(self._waiting))
            self._drops.drop("evicted while silent")
            self._finish(oldest)            # closed without an answer: it sees EOF
        self._waiting[conn] = None
        conn.reading = True
        conn.timer = self._loop.call_later(READ_TIMEOUT, self._on_silent, conn)
        self._loop.add_reader(sock.fileno(), self._read, conn)

    # -- reading the request ---------------------------------------------------------

    def _read(self, conn: _Conn) -> bool:
        """Read what the client sent; once the line is whole (or it closed, or sent too
        much), stop waiting for it and answer.  False while more is to come."""
        try:
            data = conn.sock.recv(MAX_REQUEST + 1)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            self._finish(conn)
            return True
        conn.buf += data
        end = conn.buf.find(b"\n")
        if end < 0 and data and len(conn.buf) <= MAX_REQUEST:
            return False                    # more to come
        self._stop_reading(conn)
        self._answer(conn, end)
        return True

    def _answer(self, conn: _Conn, end: int) -> None:
        """Answer the request in ``conn.buf`` (its line ends at ``end``; -1: it closed or
        sent too much without one)."""
        if end < 0 and len(conn.buf) > MAX_REQUEST:
            self._drops.drop("sending garbage")
            self._reply(conn, _error(f"request longer than {MAX_REQUEST} bytes"))
            return
        line = bytes(conn.buf if end < 0 else conn.buf[:end])    # EOF: what came
        if not line.strip():
            self._finish(conn)              # connected and closed (a probe)
            return
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("request is not a JSON object")
        except ValueError as exc:           # not UTF-8, not JSON, not an object
            self._drops.drop("sending garbage")
            self._reply(conn, _error(f"bad request: {exc}"))
            return
        kept = self._answers.kept(request)
        if kept is not None:
            self._reply(conn, kept)
            return
        task = asyncio.ensure_future(self._answers.answer(request, self._handler))
        task.add_done_callback(lambda t: self._finish(conn) if t.cancelled()
                               else self._reply(conn, t.result()))

    def _on_silent(self, conn: _Conn) -> None:
        self._drops.drop("silent")
        self._stop_reading(conn)
        self._reply(conn, _error(f"no request within {READ_TIMEOUT:g}s"))

    def _stop_reading(self, conn: _Conn) -> None:
        self._waiting.pop(conn, None)
        if conn.timer is not None:
            conn.timer.cancel()
            conn.timer = None
        if conn.reading:
            conn.reading = False
            self._loop.remove_reader(conn.sock.fileno())

    # -- writing the answer ----------------------------------------------------------

    def _reply(self, conn: _Conn, data: bytes) -> None:
        if conn.sock.fileno() < 0:
            return                          # closed meanwhile (evicted)
        conn.out = memoryview(data)
        self._on_write(conn)
        if conn.out and conn.sock.fileno() >= 0:
            self._loop.add_writer(conn.sock.fileno(), self._on_write, conn)
            conn.timer = self._loop.call_later(WRITE_TIMEOUT, self._on_stuck, conn)

    def _on_write(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:                     # it went away: nobody to answer
            self._finish(conn)
            return
        conn.out = conn.out[sent:]
        if not conn.out:
            self._finish(conn)

    def _on_stuck(self, conn: _Conn) -> None:
        conn.timer = None
        self._drops.drop("not reading their answer")
        self._finish(conn)

    def _finish(self, conn: _Conn) -> None:
        self._stop_reading(conn)
        fd = conn.sock.fileno()
        if fd >= 0:
            if conn.out:
                self._loop.remove_writer(fd)
            _discard_unread(conn.sock)
            conn.sock.close()


class _Conn:
    """One client's connection: what it sent so far, what is left to send it."""

    __slots__ = ("buf", "out", "reading", "sock", "timer")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.out: memoryview | bytes = b""
        self.timer: asyncio.TimerHandle | None = None
        #: a reader is registered for it (only while its line has not all come)
        self.reading = False


def _discard_unread(sock: socket.socket, most: int = 4 * MAX_REQUEST) -> None:
    """Read and drop what the client sent beyond its request: a unix socket closed with
    unread bytes resets the peer, whose ``recv`` then fails before it reads our error
    line (a 100 kB request without a newline got "Connection reset by peer")."""
    try:
        while most > 0:
            data = sock.recv(min(most, 65536))
            if not data:
                return
            most -= len(data)
    except OSError:         # nothing more now (EAGAIN), or it went away
        pass


def _error(text: str) -> bytes:
    return json.dumps({"ok": False, "error": text}).encode() + b"\n"
