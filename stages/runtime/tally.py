"""A stage's message counts in a file that outlives the stage: its last words.

A stage reports its counts to the daemon once a tick (about a second) and as it exits.  A
stage SIGKILLed (by an operator, the memory limit, the watchdog, a stop past its budget)
sends nothing as it dies, and what it did since its last report would leave the books: a
producer's acks, durably applied at the source and never delivered again, would be missing
from the summary for good.  So the counts the books read are also kept in a small shared
mapping of a file, written as they change (a producer after each settlement, a committer
after each answered commit) and at each report; writes to a ``MAP_SHARED`` page land in the
page cache and survive the process however it dies.  The daemon reads and removes the file
when the stage's process has exited, before any restart (:func:`take`), and takes it as the
incarnation's last report.

Layout (little-endian), one file per stage id in the private runtime dir, mode 0600::

    magic "OBT1", state u8, pad 3, pid u32,
    counts   one i64 per key of :data:`KEYS` (as of the stage's last write)
    flushed  one i64 per key of :data:`KEYS` (as its metrics last published them)

The daemon adds ``counts - flushed`` to the dead process's ``/metrics`` counters, and takes
``counts`` as its last report.

``state`` is set to ``WRITING`` before the counts are written and to ``READY`` after: a
process killed in the middle of a write leaves ``WRITING``, which reads as "nothing to
add" (the last report stands), never as counts torn between two writes.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass

MAGIC = b"OBT1"
#: the counts kept (those the daemon's books total over a stage's incarnations)
KEYS = ("in", "out", "failed", "acked", "requeued", "batches", "already_written")
HEADER = struct.Struct("<4sB3xI")
STATE_AT = 4
VALUES = struct.Struct("<" + "q" * len(KEYS))
COUNTS_AT = HEADER.size
FLUSHED_AT = COUNTS_AT + VALUES.size
SIZE = FLUSHED_AT + VALUES.size
WRITING, READY = 1, 2


def path(runtime_dir: str, stage_id: str) -> str:
    return os.path.join(runtime_dir, f"{stage_id}.tally")


class Tally:
    """The stage's side: :meth:`write` its counters whenever the books would miss them."""

    def __init__(self, file_path: str, pid: int) -> None:
        # O_NOFOLLOW: a symlink planted in the runtime dir must not redirect our writes
        fd = os.open(file_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, 0)          # a previous incarnation's counts are not ours
            os.ftruncate(fd, SIZE)
            self._mm = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        HEADER.pack_into(self._mm, 0, MAGIC, WRITING, pid)

    def write(self, counters: Mapping[str, int]) -> None:
        """The counts as they are now."""
        self._put(COUNTS_AT, counters)

    def flushed(self, counters: Mapping[str, int]) -> None:
        """The counts the stage's metrics have just published."""
        self._put(FLUSHED_AT, counters)

    def _put(self, at: int, counters: Mapping[str, int]) -> None:
        mm = self._mm
        mm[STATE_AT] = WRITING
        VALUES.pack_into(mm, at, *[int(counters.get(k, 0)) for k in KEYS])
        mm[STATE_AT] = READY


class _NoTally(Tally):
    """A stage that is not run as a process (unit tests): nothing to keep."""

    def __init__(self) -> None:
        pass

    def _put(self, at: int, counters: Mapping[str, int]) -> None:
        pass


NO_TALLY: Tally = _NoTally()


@dataclass(frozen=True)
class LastWords:
    """What a tally file says: the counts, and those the metrics last published."""

    counts: dict[str, int]
    flushed: dict[str, int]

    def unpublished(self) -> dict[str, int]:
        """The counts the stage's metrics never published (its last flush was before)."""
        return {k: v - self.flushed[k] for k, v in self.counts.items()
                if v > self.flushed[k]}


def parse(raw: bytes, pid: int) -> LastWords | None:
    """A tally file's bytes, if they are whole and ``pid``'s."""
    if len(raw) < SIZE:
        return None
    magic, state, owner = HEADER.unpack_from(raw)
    if magic != MAGIC or state != READY or owner != pid:
        return None
    return LastWords(dict(zip(KEYS, VALUES.unpack_from(raw, COUNTS_AT))),
                     dict(zip(KEYS, VALUES.unpack_from(raw, FLUSHED_AT))))


def take(file_path: str, pid: int) -> LastWords | None:
    """Read and remove the tally of a stage whose process ``pid`` has exited (the daemon,
    before the stage restarts), or None (no file, another process's, torn)."""
    try:
        fd = os.open(file_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, SIZE)
    except OSError:
        return None
    finally:
        os.close(fd)
    words = parse(raw, pid)
    if words is not None:
        try:
            os.unlink(file_path)
        except OSError:
            pass
    return words
