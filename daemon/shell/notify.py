"""sd_notify(3) in a few lines: tell systemd READY=1, STATUS=…, STOPPING=1, WATCHDOG=1.

Without ``$NOTIFY_SOCKET`` (not under systemd) every call does nothing.  The socket may be
in the abstract namespace (a leading ``@``).
"""

from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self, address: str | None = None) -> None:
        address = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        self.address = address or None
        self._sock: socket.socket | None = None
        if self.address:
            if self.address.startswith("@"):
                self.address = "\0" + self.address[1:]
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, **fields: object) -> None:
        if self._sock is None:
            return
        payload = "\n".join(f"{k.upper()}={v}" for k, v in fields.items()).encode()
        try:
            self._sock.sendto(payload, self.address)
        except OSError:
            pass   # systemd gone or the socket full: never worth failing the daemon over

    def ready(self, status: str = "") -> None:
        self.send(ready=1, status=status) if status else self.send(ready=1)

    def status(self, text: str) -> None:
        self.send(status=text)

    def stopping(self) -> None:
        self.send(stopping=1)

    def watchdog(self) -> None:
        self.send(watchdog=1)

    def extend_timeout(self, seconds: float) -> None:
        self.send(extend_timeout_usec=int(seconds * 1_000_000))

    @staticmethod
    def watchdog_interval() -> float | None:
        """Half of systemd's ``WatchdogSec`` (``$WATCHDOG_USEC``), if it asks for pings."""
        usec = os.environ.get("WATCHDOG_USEC")
        pid = os.environ.get("WATCHDOG_PID")
        if not usec or (pid and pid != str(os.getpid())):
            return None
        return int(usec) / 2_000_000
