"""One rate limit shared by every producer of a pipeline: a token bucket in shared memory.

Broadway's ``rate_limiting`` lets all producers of a pipeline take ``allowed_messages``
per ``interval`` between them, and a producer that finds the budget spent stops fetching
until the next interval.  Here the producers are processes, so the budget lives in a small
file in the daemon's private runtime directory, mapped by the daemon and by every producer,
and changed under an ``flock``.

Why shared memory rather than the daemon handing out tokens over the hub: a grant over the
hub is a round trip per fetch (or a static split of the budget between producers, which
wastes what an idle producer does not use), while a producer with demand here takes its
tokens in one locked read-modify-write of 48 bytes, two syscalls per *fetch* (never per
message).  With the limit off, a producer reads one field of the mapping and makes no
syscall at all.  The daemon writes the limit (from the config at start, or from
``offbroadway rate-limit`` at run time) and reads the counters for ``status`` and metrics.

Windows are aligned to the system's monotonic clock (shared by all processes of the
machine): the budget refills at each multiple of ``interval``, and a change of the limit
starts a new window at once, so it takes effect immediately.

The arithmetic is a pure function (:func:`take`) over a :class:`Bucket`; the file and the
lock are a thin shell (:class:`SharedRateLimit`).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
import time
from dataclasses import dataclass, replace

#: the file in the runtime directory
FILE_NAME = "rate-limit"
_MAGIC = 0x0B_12A7E_01
# magic, allowed (-1: off), interval ns, window start ns, remaining, throttled, granted
_LAYOUT = struct.Struct("<qqqqqqq")
OFF = -1


@dataclass(frozen=True)
class Bucket:
    """The shared state.  ``allowed == OFF`` means no limit."""

    allowed: int = OFF
    interval_ns: int = 1_000_000_000
    window_start: int = 0
    remaining: int = 0
    throttled: int = 0
    granted: int = 0

    @property
    def on(self) -> bool:
        return self.allowed != OFF


def window_of(now_ns: int, interval_ns: int) -> int:
    """The start of the window ``now_ns`` falls in."""
    return now_ns - now_ns % interval_ns


def take(bucket: Bucket, want: int, now_ns: int) -> tuple[int, Bucket]:
    """Grant up to ``want`` tokens; returns (granted, the new bucket).

    A grant smaller than ``want`` counts once in ``throttled`` (a fetch the limit cut).
    """
    if not bucket.on or want <= 0:
        return max(want, 0), bucket
    start = window_of(now_ns, bucket.interval_ns)
    if start != bucket.window_start:
        bucket = replace(bucket, window_start=start, remaining=bucket.allowed)
    granted = min(want, bucket.remaining)
    return granted, replace(bucket, remaining=bucket.remaining - granted,
                            throttled=bucket.throttled + (granted < want),
                            granted=bucket.granted + granted)


def give_back(bucket: Bucket, n: int, window_start: int) -> Bucket:
    """Return tokens a fetch did not use, if their window is still the current one."""
    if n <= 0 or not bucket.on or window_start != bucket.window_start:
        return bucket
    return replace(bucket, remaining=min(bucket.allowed, bucket.remaining + n),
                   granted=bucket.granted - n)


def set_limit(bucket: Bucket, allowed: int, interval: float, now_ns: int) -> Bucket:
    """A new limit (``allowed = OFF`` turns it off), effective at once: a fresh window."""
    interval_ns = max(1, int(interval * 1e9)) if allowed != OFF else bucket.interval_ns
    return replace(bucket, allowed=allowed, interval_ns=interval_ns,
                   window_start=window_of(now_ns, interval_ns), remaining=max(allowed, 0))


def parse(text: str) -> tuple[int, float] | None:
    """``"N/seconds"`` (``"500/1"``, ``"100/0.5s"``) or ``"off"`` → (N, seconds) or None.

    Raises ``ValueError`` with a message fit for one line of CLI output.
    """
    text = text.strip().lower()
    if text == "off":
        return None
    n, sep, seconds = text.partition("/")
    try:
        if not sep:
            raise ValueError
        allowed, interval = int(n), float(seconds.removesuffix("s"))
    except ValueError:
        raise ValueError(f"rate limit {text!r}: expected N/SECONDS (e.g. 500/1 for 500 "
                         f"messages a second) or off") from None
    if allowed < 1 or not 0 < interval <= 86400:
        raise ValueError(f"rate limit {text!r}: N must be at least 1 and SECONDS between 0 "
                         f"and 86400")
    return allowed, interval


def describe(bucket: Bucket) -> dict:
    """What ``status`` and metrics show."""
    return {"allowed_messages": bucket.allowed if bucket.on else None,
            "interval": bucket.interval_ns / 1e9 if bucket.on else None,
            "throttled": bucket.throttled, "granted": bucket.granted,
            "remaining": bucket.remaining if bucket.on else None}


class SharedRateLimit:
    """The bucket in ``<runtime_dir>/rate-limit``, mapped; every change under ``flock``."""

    def __init__(self, fd: int, path: str) -> None:
        self._fd = fd
        self.path = path
        self._map = mmap.mmap(fd, _LAYOUT.size)
        #: window start of the last grant, for give_back
        self.window = 0

    @classmethod
    def create(cls, runtime_dir: str, limit: tuple[int, float] | None) -> SharedRateLimit:
        """The daemon, at start: a fresh file with the configured limit (or off)."""
        path = os.path.join(runtime_dir, FILE_NAME)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        os.ftruncate(fd, _LAYOUT.size)
        shared = cls(fd, path)
        shared._write(Bucket())
        shared.set(limit)
        return shared

    @classmethod
    def attach(cls, runtime_dir: str) -> SharedRateLimit | None:
        """A producer: the daemon's file, or None when there is none (a stage run alone)."""
        path = os.path.join(runtime_dir, FILE_NAME)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        if os.fstat(fd).st_size < _LAYOUT.size:
            os.close(fd)
            return None
        return cls(fd, path)

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)

    def remove(self) -> None:
        """The daemon, at exit: close and delete the file (a clean exit leaves nothing)."""
        self.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    # -- producers -----------------------------------------------------------------------------
    def take(self, want: int) -> int:
        """Tokens for a fetch of ``want``; no syscall while the limit is off."""
        if _LAYOUT.unpack_from(self._map)[1] == OFF:
            return want
        with self._locked():
            granted, bucket = take(self._read(), want, time.monotonic_ns())
            self._write(bucket)
        self.window = bucket.window_start
        return granted

    def give_back(self, n: int) -> None:
        if n > 0 and _LAYOUT.unpack_from(self._map)[1] != OFF:
            with self._locked():
                self._write(give_back(self._read(), n, self.window))

    def next_window_in(self) -> float:
        """Seconds until the budget refills (what a throttled producer waits)."""
        b = self.read()
        if not b.on:
            return 0.0
        return max(0.001, (b.window_start + b.interval_ns - time.monotonic_ns()) / 1e9)

    # -- the daemon ----------------------------------------------------------------------------
    def set(self, limit: tuple[int, float] | None) -> Bucket:
        allowed, interval = limit if limit is not None else (OFF, 1.0)
        with self._locked():
            bucket = set_limit(self._read(), allowed, interval, time.monotonic_ns())
            self._write(bucket)
        return bucket

    def read(self) -> Bucket:
        return self._read()

    # -- the file ------------------------------------------------------------------------------
    def _read(self) -> Bucket:
        magic, *fields = _LAYOUT.unpack_from(self._map)
        if magic != _MAGIC:
            return Bucket()
        return Bucket(*fields)

    def _write(self, b: Bucket) -> None:
        _LAYOUT.pack_into(self._map, 0, _MAGIC, b.allowed, b.interval_ns, b.window_start,
                          b.remaining, b.throttled, b.granted)

    def _locked(self) -> _Flock:
        return _Flock(self._fd)


class _Flock:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *_: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
