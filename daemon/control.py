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


async def serve(path: str, handler: Handler) -> asyncio.AbstractServer:
    import asyncio

    if os.path.exists(path):
        os.unlink(path)

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 10)
            try:
                request = json.loads(line)
                if not isinstance(request, dict):
                    raise ValueError("request is not a JSON object")
                reply = await handler(request)
            except Exception as exc:
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    old = os.umask(0o177)     # the socket is created 0600: only the service user may steer
    try:
        server = await asyncio.start_unix_server(on_client, path=path)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    return server


def request(path: str, payload: dict, timeout: float = 30.0) -> dict[str, Any]:
    """Synchronous client used by the CLI; every failure is a :class:`ControlError` with
    one line for the operator (a daemon that is shutting down may close mid-answer)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
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
