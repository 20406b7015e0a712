"""Which message a processor is running right now, in a file that outlives the processor.

A handler that kills its own process (``os._exit``, a segfault in C code, memory past
``memory_limit``, a hang the heartbeat watchdog ends) leaves no exception to catch: the
only trace is how the process ended.  To dead-letter such a *poison* message instead of
redelivering it forever, the daemon must know which message was running at the moment of
death, and nothing the processor could send at that moment would arrive.  So the
processor keeps a record of it in a small shared mapping of a file: writes to a
``MAP_SHARED`` page land in the page cache and survive the process however it dies, and
reading them is one ``read`` for the daemon.

The record is rewritten before every ``handle_message`` (and before ``prepare_messages``,
for the whole frame) and marked idle after the frame: about 1 µs per message measured at
load average 5 (``bench/blame.py``; a frame-at-once layout was tried and was no
cheaper).  The file lives in the private runtime dir (0700) with mode 0600, so only the
service user can read which messages are being handled.

Layout (little-endian), one :data:`SIZE`-byte file per processor::

    header  magic "OBB1", state u8, pad u8, entries u16, frame size u32
    entry   producer index u16, token u64, id length u16, id (UTF-8)   x entries

(``MESSAGE`` records leave the header's counts alone: one entry, by definition, so the hot
path writes one entry and the state byte and nothing else.)

``state`` is written last: a process killed in the middle of a write (SIGKILL by the memory
limit can land anywhere) leaves ``WRITING``, which reads as "no blame", never as a record
torn between two messages.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

MAGIC = b"OBB1"
SIZE = 4096
HEADER = struct.Struct("<4sBxHI")
ENTRY = struct.Struct("<HQH")
STATE_AT = 4
#: longest id a record holds (in UTF-8 bytes); a longer one is not blamed
MAX_ID = SIZE - 12 - 12
IDLE, MESSAGE, FRAME, WRITING = 0, 1, 2, 3
KINDS = {MESSAGE: "handle_message", FRAME: "prepare_messages"}


class Blamed(Protocol):
    """What a record needs of a message (:class:`offbroadway.Message` has it)."""

    id: str
    origin: int
    token: int


@dataclass(frozen=True)
class Suspect:
    producer: int
    token: int
    id: str


@dataclass(frozen=True)
class Blame:
    """What a dead processor was running: one message, or a ``prepare_messages`` frame.

    ``frame_size`` can exceed ``len(suspects)`` when a frame's ids did not all fit.
    """

    kind: str
    suspects: tuple[Suspect, ...]
    frame_size: int


def path(runtime_dir: str, stage_id: str) -> str:
    return os.path.join(runtime_dir, f"{stage_id}.blame")


def _encode_id(msg_id: object) -> bytes:
    text = msg_id if isinstance(msg_id, str) else str(msg_id)
    return text.encode("utf-8", "surrogatepass")


#: id length -> Struct of a whole entry with its id, so a message costs one pack_into
_ENTRIES: dict[int, struct.Struct] = {}


def _entry(n: int) -> struct.Struct:
    s = _ENTRIES.get(n)
    if s is None:
        s = _ENTRIES[n] = struct.Struct(f"<HQH{n}s")
    return s


class BlameRecorder:
    """The processor's side: ``message`` / ``frame`` before running user code, ``idle``
    after.  Never raises on a message it cannot record (an id too long, a token out of
    range): that message is simply not blamed, and the pipeline does what it did before."""

    def __init__(self, file_path: str) -> None:
        # O_NOFOLLOW: a symlink planted in the runtime dir must not redirect our writes
        fd = os.open(file_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, 0)          # a previous incarnation's record is not ours
            os.ftruncate(fd, SIZE)
            self._mm = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        HEADER.pack_into(self._mm, 0, MAGIC, IDLE, 0, 0)

    def message(self, m: Blamed) -> None:
        # the hot path: ~3 operations per message (bench/blame.py)
        mm = self._mm
        mm[STATE_AT] = WRITING
        try:
            raw = m.id.encode()
            n = len(raw)
            if n > MAX_ID:
                return
            (_ENTRIES.get(n) or _entry(n)).pack_into(mm, HEADER.size, m.origin, m.token, n,
                                                     raw)
        except (struct.error, UnicodeError, TypeError, AttributeError):
            return self._message_slow(m)
        mm[STATE_AT] = MESSAGE

    def _message_slow(self, m: Blamed) -> None:
        """An id that is not plain text (not a str, or lone surrogates from JSON)."""
        try:
            raw = _encode_id(m.id)
            if len(raw) <= MAX_ID:
                _entry(len(raw)).pack_into(self._mm, HEADER.size, m.origin, m.token, len(raw),
                                           raw)
                self._mm[STATE_AT] = MESSAGE
        except (struct.error, UnicodeError, TypeError):
            pass

    def frame(self, messages: Sequence[Blamed]) -> None:
        mm = self._mm
        mm[STATE_AT] = WRITING
        at = HEADER.size
        n = 0
        for m in messages:
            try:
                raw = _encode_id(m.id)
                end = at + ENTRY.size + len(raw)
                if end > SIZE:
                    break
                ENTRY.pack_into(mm, at, m.origin, m.token, len(raw))
            except (struct.error, UnicodeError, TypeError):
                continue
            mm[at + ENTRY.size:end] = raw
            at = end
            n += 1
        HEADER.pack_into(mm, 0, MAGIC, FRAME, n, min(len(messages), 2**32 - 1))

    def idle(self) -> None:
        self._mm[STATE_AT] = IDLE

    def close(self) -> None:
        self.idle()
        self._mm.close()


def parse(raw: bytes) -> Blame | None:
    """A record's bytes → what was running, or None (idle, torn, or not a record)."""
    if len(raw) < HEADER.size:
        return None
    magic, state, count, frame_size = HEADER.unpack_from(raw, 0)
    if magic != MAGIC or state not in KINDS:
        return None
    if state == MESSAGE:
        count = frame_size = 1
    suspects = []
    at = HEADER.size
    for _ in range(count):
        if at + ENTRY.size > len(raw):
            return None
        producer, token, length = ENTRY.unpack_from(raw, at)
        at += ENTRY.size
        if at + length > len(raw):
            return None
        suspects.append(Suspect(producer, token,
                                raw[at:at + length].decode("utf-8", "surrogatepass")))
        at += length
    return Blame(KINDS[state], tuple(suspects), frame_size)


def take(file_path: str) -> Blame | None:
    """Read and remove a dead processor's record (the daemon, on an unexpected exit).

    Removing it means a later incarnation that dies before it has written a record of its
    own (a crash at import) cannot blame the same message twice.
    """
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
    try:
        os.unlink(file_path)
    except OSError:
        pass
    try:
        return parse(raw)
    except (struct.error, UnicodeError):
        return None
