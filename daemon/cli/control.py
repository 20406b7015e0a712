"""The operator's control socket, the asking side: ``<runtime_dir>/control.sock``, mode
0600, JSON lines.

One request per connection: ``{"cmd": "status"}`` → one JSON reply.  The CLI verbs
(status, restart, drain, resume, stop) are thin clients of :func:`request`; the daemon's
side is :mod:`..shell.control_server`.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from ..config.records import CONTROL_SOCKET  # noqa: F401  (the socket's name, for the CLI's callers)


class ControlError(RuntimeError):
    """The daemon could not be reached or refused the request."""


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
