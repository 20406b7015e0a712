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

    magic "OBT2", flags u8, counts' copy u8, flushed's copy u8, pad 1, pid u32,
    counts   two copies of one i64 per key of :data:`KEYS` (as of the stage's last write)
    flushed  two copies, the same (as its metrics last published them)
    acked    i64: a producer's acks, kept by one 8-byte store as they are applied (flag
             :data:`ACKED_SLOT`): it stands for ``counts["acked"]``
    doubt    when f64, base i64, n i64, then up to :data:`DOUBT_MAX` digests i64: the
             ack frame a source was sending (:class:`SentAcks`)

The ``acked`` slot is what a producer updates on its hot path (one store per settlement,
not the whole record).  A source whose acks leave on its own I/O thread, in their own time
(RabbitMQ sends the acks behind a still unsettled delivery after a while), keeps it
itself, once the broker was sent the ack (:class:`SentAcks`): an ack counted when the
producer handed it over, and lost with the process before it left, would be counted again
when the broker delivers the message again.

The daemon adds ``counts - flushed`` to the dead process's ``/metrics`` counters, and takes
``counts`` as its last report.

A record (counts, flushed) is written into the copy not in use, and then the copy byte
names it (one store): a process killed in the middle of a write leaves the copy byte on
the previous write, read whole, never counts torn between two writes.  0 names no copy:
nothing written yet.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import time
from array import array
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

MAGIC = b"OBT2"
#: the counts kept (those the daemon's books total over a stage's incarnations)
KEYS = ("in", "out", "failed", "acked", "requeued", "batches", "already_written")
HEADER = struct.Struct("<4sBBBxI")
FLAGS_AT = 4
#: the byte naming the copy in use (1 or 2; 0: never written) of counts, and of flushed
COPY_OF = {"counts": 5, "flushed": 6}
#: flag: the ``acked`` slot is the stage's count of acks
ACKED_SLOT = 1
VALUES = struct.Struct("<" + "q" * len(KEYS))
COUNTS_AT = HEADER.size
FLUSHED_AT = COUNTS_AT + 2 * VALUES.size
ACKED_AT = FLUSHED_AT + 2 * VALUES.size
#: the ack frame on its way: when it began to leave, the count of acks sent before it, how
#: many it acks, and their digests
DOUBT = struct.Struct("<dqq")
DOUBT_AT = ACKED_AT + 8
DIGESTS_AT = DOUBT_AT + DOUBT.size
#: the most acks one frame described here may carry (AMQP's largest prefetch window: a
#: source splits a longer run of acks into frames of this many)
DOUBT_MAX = 65535
SIZE = DIGESTS_AT + 8 * DOUBT_MAX
#: the part read whole (the digests are read as many as the doubt says)
FIXED = DIGESTS_AT


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
            os.ftruncate(fd, SIZE)       # sparse: the digests' pages are used as needed
            self._mm = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        HEADER.pack_into(self._mm, 0, MAGIC, 0, 0, 0, pid)

    def acked_slot(self) -> memoryview:
        """The slot where the stage's count of acks is kept from now on (``slot[0] = n``,
        one 8-byte store, from whichever thread applies the acks)."""
        self._mm[FLAGS_AT] = ACKED_SLOT
        return memoryview(self._mm)[ACKED_AT:ACKED_AT + 8].cast("q")

    def sent_acks(self) -> SentAcks:
        """The count of acks for a source that keeps it as its frames leave."""
        return SentAcks(self.acked_slot(),
                        memoryview(self._mm)[DOUBT_AT:SIZE])

    def write(self, counters: Mapping[str, int]) -> None:
        """The counts as they are now."""
        self._put("counts", COUNTS_AT, counters)

    def flushed(self, counters: Mapping[str, int]) -> None:
        """The counts the stage's metrics have just published."""
        self._put("flushed", FLUSHED_AT, counters)

    def _put(self, record: str, at: int, counters: Mapping[str, int]) -> None:
        mm, copy_at = self._mm, COPY_OF[record]
        copy = 2 if mm[copy_at] == 1 else 1        # the one not in use
        VALUES.pack_into(mm, at + (copy - 1) * VALUES.size,
                         *[int(counters.get(k, 0)) for k in KEYS])
        mm[copy_at] = copy


class SentAcks:
    """A source's count of the acks it sent, and the ack frame on its way.

    The count goes up once a frame has left (its write returned): counted before, a frame
    lost with the process would be counted, and its messages, delivered again, counted a
    second time.  But between the write and the count the process can die: a SIGKILL
    lands there as anywhere, and the window is wider than it looks, since the I/O thread
    waits for the GIL after each write (up to the switch interval on a busy producer, more
    on a loaded machine).  The frame's acks, applied by the broker, would be missing from
    the books for good.  So before the write the frame is described here (:meth:`leaving`):
    its messages' digests, when, and the count it starts from.  Read after a death
    (:func:`parse`): if the count still says that, the frame was on its way, and whether
    it arrived only the broker knows.  The messages of a frame that did not arrive come
    back, redelivered, and their settlement is noted with the same digests
    (daemon/core/failing.py); those that never come back were acked.

    Order of the stores, each one 8-byte store: digests, when and how many, then the base;
    then, once the frame left, the count.  A frame is live only while the base equals the
    count, so a death between any two stores reads either as no frame or as this one.
    """

    def __init__(self, count: memoryview, doubt: memoryview) -> None:
        self.count = count
        self._doubt = doubt
        self._when = doubt[0:8].cast("d")
        self._ints = doubt[8:DOUBT.size].cast("q")
        self._digests = doubt[DOUBT.size:].cast("q")

    def leaving(self, digests: list[int], sent: int) -> None:
        """A frame of ``len(digests)`` acks (at most :data:`DOUBT_MAX`) is about to be
        written; ``sent``: the acks counted so far."""
        n = len(digests)
        self._digests[:n] = array("q", digests)
        self._when[0] = time.monotonic()
        self._ints[1] = n
        self._ints[0] = sent

    def left(self, sent: int) -> None:
        """The frame was written: ``sent`` acks in all now."""
        self.count[0] = sent


class _NoTally(Tally):
    """A stage that is not run as a process (unit tests): nothing to keep."""

    def __init__(self) -> None:
        pass

    def _put(self, record: str, at: int, counters: Mapping[str, int]) -> None:
        pass

    def acked_slot(self) -> memoryview:
        return memoryview(bytearray(8)).cast("q")

    def sent_acks(self) -> SentAcks:
        return SentAcks(self.acked_slot(), memoryview(bytearray(SIZE - DOUBT_AT)))


NO_TALLY: Tally = _NoTally()


@dataclass(frozen=True)
class Doubt:
    """An ack frame a source was sending as it died: when it began to leave
    (``time.monotonic()``) and its messages' digests.  The broker got all of it or none."""

    when: float
    digests: tuple[int, ...]


@dataclass(frozen=True)
class LastWords:
    """What a tally file says: the counts, those the metrics last published, and the ack
    frame that may or may not have reached the broker (not in ``counts``)."""

    counts: dict[str, int]
    flushed: dict[str, int]
    doubt: Doubt | None = None

    def unpublished(self) -> dict[str, int]:
        """The counts the stage's metrics never published (its last flush was before)."""
        return {k: v - self.flushed[k] for k, v in self.counts.items()
                if v > self.flushed[k]}


def _record(raw: bytes, record: str, at: int) -> dict[str, int] | None:
    copy = raw[COPY_OF[record]]
    if copy not in (1, 2):
        return None
    return dict(zip(KEYS, VALUES.unpack_from(raw, at + (copy - 1) * VALUES.size)))


def parse(raw: bytes, pid: int, digests: Callable[[int], bytes] | None = None
          ) -> LastWords | None:
    """A tally file's fixed part, if it is ``pid``'s and was written; ``digests(n)``
    reads the first ``n`` digests of a frame in doubt."""
    if len(raw) < FIXED:
        return None
    magic, flags, _, _, owner = HEADER.unpack_from(raw)
    if magic != MAGIC or owner != pid:
        return None
    counts = _record(raw, "counts", COUNTS_AT)
    if counts is None:
        return None
    flushed = _record(raw, "flushed", FLUSHED_AT) or dict.fromkeys(KEYS, 0)
    doubt = None
    if flags & ACKED_SLOT:
        acked = struct.unpack_from("<q", raw, ACKED_AT)[0]
        counts["acked"] = acked
        when, base, n = DOUBT.unpack_from(raw, DOUBT_AT)
        if base == acked and 0 < n <= DOUBT_MAX and digests is not None:
            got = digests(n)
            if len(got) == 8 * n:
                doubt = Doubt(when, struct.unpack(f"<{n}q", got))
    return LastWords(counts, flushed, doubt)


def take(file_path: str, pid: int) -> LastWords | None:
    """Read and remove the tally of a stage whose process ``pid`` has exited (the daemon,
    before the stage restarts), or None (no file, another process's, never written)."""
    try:
        fd = os.open(file_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, FIXED)
        words = parse(raw, pid, lambda n: os.pread(fd, 8 * n, DIGESTS_AT))
    except OSError:
        return None
    finally:
        os.close(fd)
    if words is not None:
        _remove(file_path)
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
    _remove(file_path)
    return notes


def _remove(file_path: str) -> None:
    """A file the daemon has read: gone, so that no later incarnation reads it as its
    own (already gone is as good)."""
    with contextlib.suppress(OSError):
        os.unlink(file_path)
