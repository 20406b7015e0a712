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

    magic "OBT1", state u8, flags u8, pad 2, pid u32,
    counts   one i64 per key of :data:`KEYS` (as of the stage's last write)
    flushed  one i64 per key of :data:`KEYS` (as its metrics last published them)
    acked    i64: a producer's acks, kept by one 8-byte store as they are applied (flag
             :data:`ACKED_SLOT`): it stands for ``counts["acked"]``

The ``acked`` slot is what a producer updates on its hot path (one store per settlement,
not the whole record).  A source whose acks leave on its own I/O thread, in their own time
(RabbitMQ sends the acks behind a still unsettled delivery after a while), keeps it
itself, once the broker was sent the ack (:meth:`Tally.acked_slot`): an ack counted when
the producer handed it over, and lost with the process before it left, would be counted
again when the broker delivers the message again.

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
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

MAGIC = b"OBT1"
#: the counts kept (those the daemon's books total over a stage's incarnations)
KEYS = ("in", "out", "failed", "acked", "requeued", "batches", "already_written")
HEADER = struct.Struct("<4sBB2xI")
STATE_AT = 4
FLAGS_AT = 5
#: flag: the ``acked`` slot is the stage's count of acks
ACKED_SLOT = 1
VALUES = struct.Struct("<" + "q" * len(KEYS))
COUNTS_AT = HEADER.size
FLUSHED_AT = COUNTS_AT + VALUES.size
ACKED_AT = FLUSHED_AT + VALUES.size
SIZE = ACKED_AT + 8
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
        HEADER.pack_into(self._mm, 0, MAGIC, WRITING, 0, pid)

    def acked_slot(self) -> memoryview:
        """The slot where the stage's count of acks is kept from now on (``slot[0] = n``,
        one 8-byte store, from whichever thread applies the acks)."""
        self._mm[FLAGS_AT] = ACKED_SLOT
        return memoryview(self._mm)[ACKED_AT:ACKED_AT + 8].cast("q")

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

    def acked_slot(self) -> memoryview:
        return memoryview(bytearray(8)).cast("q")


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
    magic, state, flags, owner = HEADER.unpack_from(raw)
    if magic != MAGIC or state != READY or owner != pid:
        return None
    counts = dict(zip(KEYS, VALUES.unpack_from(raw, COUNTS_AT)))
    if flags & ACKED_SLOT:
        counts["acked"] = struct.unpack_from("<q", raw, ACKED_AT)[0]
    return LastWords(counts, dict(zip(KEYS, VALUES.unpack_from(raw, FLUSHED_AT))))


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


# -- a producer's failure-book notes -------------------------------------------------------
#: a producer's notes file: header (magic "OBN1", pad 4, pid u32, pad 4, notes written
#: u64), then a ring of :data:`RING` notes (kind u8, pad 7, digest i64, when f64)
NOTES_MAGIC = b"OBN1"
NOTES_HEADER = struct.Struct("<4s4xI4xQ")
NOTE = struct.Struct("<B7xqd")
#: notes the ring holds: more than any producer notes between two reports (a second)
RING = 1 << 17
NOTES_SIZE = NOTES_HEADER.size + RING * NOTE.size
_COUNT_AT = 16


def notes_path(runtime_dir: str, stage_id: str) -> str:
    return os.path.join(runtime_dir, f"{stage_id}.notes")


class NoteRing:
    """A producer's failure-book notes (daemon/core/failing.py), each also written to a
    ring in a shared mapping of a file as it is made: the notes since its last report go
    with the report, and a SIGKILL would lose them (a message that failed, then went
    through in the last second, would stay failing in the daemon's books for good).  The
    daemon reads the ring when the producer has exited (:func:`take_notes`).  A note is
    written before the count that includes it: a write cut short is not read."""

    def __init__(self, file_path: str, pid: int) -> None:
        fd = os.open(file_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, 0)
            os.ftruncate(fd, NOTES_SIZE)     # sparse: pages are used as notes fill them
            self._mm = mmap.mmap(fd, NOTES_SIZE)
        finally:
            os.close(fd)
        NOTES_HEADER.pack_into(self._mm, 0, NOTES_MAGIC, pid, 0)
        self._count = 0
        self._counter = memoryview(self._mm)[_COUNT_AT:_COUNT_AT + 8].cast("Q")

    def write(self, kind: int, digest: int, when: float) -> None:
        n = self._count
        NOTE.pack_into(self._mm, NOTES_HEADER.size + (n % RING) * NOTE.size, kind, digest,
                       when)
        self._count = self._counter[0] = n + 1


class JournaledNotes(deque):
    """A deque of notes (``(kind, digest, when)``) that writes each one appended to a
    :class:`NoteRing` too: a source's notes, as it makes them."""

    def __init__(self, ring: NoteRing, maxlen: int | None = None) -> None:
        super().__init__(maxlen=maxlen)
        self.ring = ring

    def append(self, note: tuple[int, int, float]) -> None:
        self.ring.write(*note)
        super().append(note)


def take_notes(file_path: str, pid: int) -> list[list]:
    """The notes in the ring of a producer whose process ``pid`` has exited, oldest first
    (``[kind, digest, when]``), and the file removed; [] if there is none of ``pid``'s."""
    try:
        fd = os.open(file_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as mm:
            if len(mm) < NOTES_SIZE:
                return []
            magic, owner, count = NOTES_HEADER.unpack_from(mm)
            if magic != NOTES_MAGIC or owner != pid:
                return []
            first = max(0, count - RING)
            notes = [list(NOTE.unpack_from(mm, NOTES_HEADER.size + (i % RING) * NOTE.size))
                     for i in range(first, count)]
    except (OSError, ValueError):
        return []
    finally:
        os.close(fd)
    try:
        os.unlink(file_path)
    except OSError:
        pass
    return notes
