"""The operator's control socket: ``<runtime_dir>/control.sock``, mode 0600, JSON lines.

One request per connection: ``{"cmd": "status"}`` → one JSON reply.  The CLI verbs
(status, restart, drain, resume, stop) are thin clients of this.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from typing import TYPE_CHECKING, Any, Awaitable, Callable

if TYPE_CHECKING:     # the CLI's client side never pays for importing asyncio
    import asyncio

log = logging.getLogger("offbroadway.daemon.control")

CONTROL_SOCKET = "control.sock"
Handler = Callable[[dict], Awaitable[dict]]


class ControlError(RuntimeError):
    """The daemon could not be reached or refused the request."""


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
#: connections accepted per second at most, and in one burst (see :func:`_accept`)
ACCEPT_RATE = 100.0
ACCEPT_BURST = 20
#: verbs that change nothing, whose answer is shared by requests this close together
SHARED = frozenset({"status"})
SHARED_FOR = 0.2


class _Drops:
    """Counts clients dropped (silent, garbage, evicted) and says so at most once per
    :data:`DROP_LOG_INTERVAL`: a hostile client must not flood the journal either."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._last_log = float("-inf")

    def drop(self, why: str) -> None:
        import time

        self.counts[why] = self.counts.get(why, 0) + 1
        now = time.monotonic()
        if now - self._last_log >= DROP_LOG_INTERVAL:
            self._last_log = now
            log.warning("control socket: clients dropped so far: %s",
                        ", ".join(f"{n} {w}" for w, n in sorted(self.counts.items())))


class _Answers:
    """Read-only answers shared by requests within :data:`SHARED_FOR` seconds.

    A ``status`` costs the daemon about 2 ms of CPU (the tree, the board, psutil for each
    child, the JSON); a client asking 1,000 times a second would take a whole core from
    the loop that also runs the hub and the supervisors.  The stages report once a
    second, so an answer a fifth of a second old is as fresh as a new one; any other verb
    (a restart, a reload...) drops what is kept, so a ``status`` after it sees its
    effect."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[float, bytes]] = {}

    async def answer(self, request: dict, handler: Handler) -> bytes:
        import time

        key = json.dumps(request, sort_keys=True) if request.get("cmd") in SHARED else None
        now = time.monotonic()
        if key is not None:
            kept = self._kept.get(key)
            if kept is not None and now - kept[0] < SHARED_FOR:
                return kept[1]
        else:
            self._kept.clear()
        try:
            reply = await handler(request)
        except Exception as exc:
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        data = json.dumps(reply).encode() + b"\n"
        if key is not None and reply.get("ok"):
            self._kept[key] = (now, data)
        return data


async def serve(path: str, handler: Handler) -> asyncio.AbstractServer:
    """Serve ``path``; each connection is one request, read within :data:`READ_TIMEOUT`
    and answered within :data:`WRITE_TIMEOUT` (the handler itself may take as long as
    its command does, e.g. ``stop``).  A client that sends nothing, a line that is not a
    JSON object or is too long, or one that does not read its answer is answered with an
    error when it can be and closed; beyond :data:`MAX_WAITING` connections waiting for
    their line, each new one closes the oldest.  Nothing a client does holds up another
    client or the loop, and a flood of ``status`` costs one answer per
    :data:`SHARED_FOR` (:class:`_Answers`)."""
    import asyncio

    if os.path.exists(path):
        os.unlink(path)
    drops = _Drops()
    answers = _Answers()
    waiting: dict[asyncio.StreamWriter, None] = {}    # insertion order: the oldest first

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(waiting) >= MAX_WAITING:
            oldest = next(iter(waiting))
            del waiting[oldest]
            drops.drop("evicted while silent")
            oldest.close()      # its readline sees EOF
        waiting[writer] = None
        try:
            reply = await _answer(reader, handler, drops, answers,
                                  lambda: waiting.pop(writer, None))
            if reply:
                writer.write(reply)
                await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)
        except TimeoutError:
            drops.drop("not reading their answer")
        except ConnectionError:
            pass
        finally:
            waiting.pop(writer, None)
            writer.close()

    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)     # the socket is created 0600: only the service user may steer
    try:
        lsock.bind(path)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    lsock.listen(256)
    lsock.setblocking(False)
    return _Server(lsock, asyncio.ensure_future(_accept(lsock, on_client)))


class _Server:
    """The control socket's listener: ``close()`` stops accepting (as asyncio's server)."""

    def __init__(self, lsock: socket.socket, task: asyncio.Future) -> None:
        self._lsock = lsock
        self._task = task

    def close(self) -> None:
        self._task.cancel()
        self._lsock.close()


async def _accept(lsock: socket.socket, on_client: Callable[..., Awaitable[None]]) -> None:
    """Accept at most :data:`ACCEPT_RATE` connections a second (bursts of
    :data:`ACCEPT_BURST`); the rest wait in the kernel's queue, and their clients in
    ``connect``, costing nobody CPU.  Each connection costs the daemon about half a
    millisecond of CPU however cheap its answer (asyncio's transport, the task): 1,000 a
    second took half a core from a two-core machine's pipeline (bench/neighbours.py)."""
    import asyncio

    loop = asyncio.get_running_loop()
    tokens, last = float(ACCEPT_BURST), loop.time()
    clients: set[asyncio.Future] = set()
    while True:
        conn, _ = await loop.sock_accept(lsock)
        now = loop.time()
        tokens = min(float(ACCEPT_BURST), tokens + (now - last) * ACCEPT_RATE)
        last = now
        if tokens < 1.0:
            await asyncio.sleep((1.0 - tokens) / ACCEPT_RATE)
            tokens, last = 1.0, loop.time()
        tokens -= 1.0
        try:
            reader, writer = await asyncio.open_unix_connection(sock=conn, limit=MAX_REQUEST)
        except OSError:
            conn.close()
            continue
        task = asyncio.ensure_future(on_client(reader, writer))
        clients.add(task)
        task.add_done_callback(clients.discard)


def _error(text: str) -> bytes:
    return json.dumps({"ok": False, "error": text}).encode() + b"\n"


async def _answer(reader: asyncio.StreamReader, handler: Handler, drops: _Drops,
                  answers: _Answers, got_line: Callable[[], object]) -> bytes:
    """Read one request line and return the encoded reply (b"" when there is no one to
    answer); ``got_line`` is called once the line is in (no longer waiting)."""
    import asyncio

    try:
        line = await asyncio.wait_for(reader.readline(), READ_TIMEOUT)
    except TimeoutError:
        drops.drop("silent")
        return _error(f"no request within {READ_TIMEOUT:g}s")
    except ValueError:    # LimitOverrunError: no newline within MAX_REQUEST bytes
        drops.drop("sending garbage")
        return _error(f"request longer than {MAX_REQUEST} bytes")
    except ConnectionError:
        return b""
    got_line()
    if not line.strip():
        return b""        # connected and closed (a probe), or evicted
    try:
        request = json.loads(line)
        if not isinstance(request, dict):
            raise ValueError("request is not a JSON object")
    except ValueError as exc:     # not UTF-8, not JSON, not an object
        drops.drop("sending garbage")
        return _error(f"bad request: {exc}")
    return await answers.answer(request, handler)


def request(path: str, payload: dict, timeout: float = 30.0) -> dict[str, Any]:
    """Synchronous client used by the CLI; every failure is a :class:`ControlError` with
    one line for the operator (a daemon that is shutting down may close mid-answer)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        _connect(sock, path, timeout)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        raise ControlError(f"no offbroadway daemon is running at {path}") from None
    except PermissionError:
        sock.close()
        raise ControlError(f"permission denied on {path} (run as the service user)") from None
    except OSError as exc:
        sock.close()
        raise ControlError(f"cannot reach the daemon at {path}: {exc.strerror or exc}") from None
    chunks = []
    try:
        with sock:
            sock.sendall(json.dumps(payload).encode() + b"\n")
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                chunks.append(data)
    except TimeoutError:
        raise ControlError(f"the daemon did not answer within {timeout:g}s") from None
    except OSError as exc:     # ConnectionResetError, BrokenPipeError: it went away
        raise ControlError(f"the daemon closed the connection without answering "
                           f"({exc.strerror or type(exc).__name__}; is it shutting down?)"
                           ) from None
    raw = b"".join(chunks)
    if not raw:
        raise ControlError("the daemon closed the connection without answering "
                           "(is it shutting down?)")
    try:
        reply = json.loads(raw)
    except ValueError:
        raise ControlError("the daemon's answer was cut short (is it shutting down?)") from None
    if not isinstance(reply, dict):
        raise ControlError("the daemon's answer is not a JSON object")
    return reply


def _connect(sock: socket.socket, path: str, timeout: float) -> None:
    """Connect, waiting while the daemon's accept backlog is full (a unix socket with a
    timeout says EAGAIN at once instead of waiting: a burst of other clients, hostile or
    not, made ``status`` fail with "Resource temporarily unavailable")."""
    import time

    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        try:
            sock.connect(path)
            return
        except BlockingIOError:
            if time.monotonic() + pause > deadline:
                raise TimeoutError(f"its connection queue stayed full for {timeout:g}s") from None
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
