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
for the whole frame) and marked idle after the frame.  With a frame's packed events
(:meth:`BlameRecorder.events`) the frame is copied into the record once, and
each ``handle_message`` then writes only its message's position in the frame (four bytes
and, for the first, the state byte): the blame stays per message, so a crash strikes the
message that was running and nothing else, at a fraction of the per-message cost of
writing its id.  A message that is not one of the frame's (``prepare_messages`` built new
ones) is recorded the old way.  The file lives in the private runtime dir (0700) with
mode 0600, so only the service user can read which messages are being handled.

Layout (little-endian), one :data:`SIZE`-byte file per processor::

    header  magic "OBB1", state u8, pad u8, entries u16, frame size u32
    entry   producer index u16, token u64, id length u16, id (UTF-8)   x entries

(``MESSAGE`` records leave the header's counts alone: one entry, by definition, so the hot
path writes one entry and the state byte and nothing else.)  After the first
:data:`SIZE` bytes, a frame's packed events (state ``PACKED``)::

    packed length u32, index u32, the frame's packed events (its columns, :mod:`..wire.events`)

the running message being the event at ``index``.

``state`` is written last: a process killed in the middle of a write (SIGKILL by the memory
limit can land anywhere) leaves ``WRITING``, which reads as "no blame", never as a record
torn between two messages.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from collections.abc import Sequence
from typing import Protocol

from ..wire import protocol
from ..wire.commands import Blame, Suspect

MAGIC = b"OBB1"
SIZE = 4096
#: a frame's packed events up to this size are copied into the record (bigger ones are
#: recorded message by message)
PACKED_MAX = 1 << 20
PACKED = struct.Struct("<II")
PACKED_AT = SIZE
INDEX_AT = SIZE + 4
#: the whole file
FILE_SIZE = SIZE + PACKED.size + PACKED_MAX
HEADER = struct.Struct("<4sBxHI")
ENTRY = struct.Struct("<HQH")
STATE_AT = 4
#: longest id a record holds (in UTF-8 bytes); a longer one is not blamed
MAX_ID = SIZE - 12 - 12
IDLE, MESSAGE, FRAME, WRITING, PACKED_MESSAGE = 0, 1, 2, 3, 4
KINDS = {MESSAGE: "handle_message", FRAME: "prepare_messages",
         PACKED_MESSAGE: "handle_message"}


class Blamed(Protocol):
    """What a record needs of a message (:class:`offbroadway.Message` has it): its id and
    its delivery envelope, the two private slots the codec (:mod:`..wire.protocol`) set
    when it built the message.  Read here as slots, not through a getter: a record is
    written before every callback that could kill the process."""

    id: str
    _origin: int
    _token: int


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
            os.ftruncate(fd, FILE_SIZE)  # sparse: pages are used as frames fill them
            self._mm = mmap.mmap(fd, FILE_SIZE)
        finally:
            os.close(fd)
        HEADER.pack_into(self._mm, 0, MAGIC, IDLE, 0, 0)
        #: the position of the running message in the packed frame, as a 4-byte store
        self._index = memoryview(self._mm)[INDEX_AT:INDEX_AT + 4].cast("I")
        #: the messages of the packed frame in the record, in order, and where the next
        #: one is expected; None when there is none
        self._frame: Sequence[object] | None = None
        self._next = 0
        self._packed_state = False

    def events(self, packed: bytes, messages: Sequence[Blamed]) -> None:
        """A frame is about to run: copy its packed events (from the wire, as they are)
        into the record once; ``messages`` are the frame's, in the same order."""
        n = len(packed)
        if n > PACKED_MAX or self._mm[STATE_AT] == PACKED_MESSAGE:
            self._frame = None
            return
        self._mm[PACKED_AT + PACKED.size:PACKED_AT + PACKED.size + n] = packed
        PACKED.pack_into(self._mm, PACKED_AT, n, 0)
        self._frame = messages
        self._next = 0

    def indexes(self, messages: Sequence[Blamed]) -> memoryview | None:
        """When ``messages`` are the packed frame's own (the list :meth:`events` was given,
        the usual case), the 4-byte store of the running message's place in it, with the
        record set to the frame's first message: the caller writes each message's index
        there before running it (one store, not a call per message).  Else None: tell
        :meth:`message` about each one."""
        if self._frame is None or self._frame is not messages:
            return None
        self._index[0] = 0
        self._mm[STATE_AT] = PACKED_MESSAGE
        self._packed_state = True
        return self._index

    def message(self, m: Blamed) -> None:
        # the hot path: with a packed frame, a 4-byte index (and the state byte for the
        # frame's first message); else ~3 operations (bench/blame.py)
        frame = self._frame
        if frame is not None:
            i = self._next
            n = len(frame)
            while i < n and frame[i] is not m:
                i += 1
            if i < n:
                self._index[0] = i
                self._next = i + 1
                if not self._packed_state:
                    self._mm[STATE_AT] = PACKED_MESSAGE
                    self._packed_state = True
                return
            self._frame = None           # prepare_messages made new messages
        self._packed_state = False
        mm = self._mm
        mm[STATE_AT] = WRITING
        try:
            raw = m.id.encode()
            n = len(raw)
            if n > MAX_ID:
                return
            (_ENTRIES.get(n) or _entry(n)).pack_into(mm, HEADER.size, m._origin, m._token, n,
                                                     raw)
        except (struct.error, UnicodeError, TypeError, AttributeError):
            return self._message_slow(m)
        mm[STATE_AT] = MESSAGE

    def _message_slow(self, m: Blamed) -> None:
        """An id that is not plain text (not a str, or lone surrogates from JSON)."""
        try:
            raw = _encode_id(m.id)
            if len(raw) <= MAX_ID:
                _entry(len(raw)).pack_into(self._mm, HEADER.size, m._origin, m._token,
                                           len(raw), raw)
                self._mm[STATE_AT] = MESSAGE
        except (struct.error, UnicodeError, TypeError):
            pass

    def frame(self, messages: Sequence[Blamed]) -> None:
        self._packed_state = False
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
                ENTRY.pack_into(mm, at, m._origin, m._token, len(raw))
            except (struct.error, UnicodeError, TypeError):
                continue
            mm[at + ENTRY.size:end] = raw
            at = end
            n += 1
        HEADER.pack_into(mm, 0, MAGIC, FRAME, n, min(len(messages), 2**32 - 1))

    def idle(self) -> None:
        self._mm[STATE_AT] = IDLE
        self._packed_state = False
        self._frame = None

    def close(self) -> None:
        self.idle()
        self._index.release()
        self._mm.close()


def parse(raw: bytes) -> Blame | None:
    """A record's bytes → what was running, or None (idle, torn, or not a record).

    The :class:`~offbroadway.stages.wire.commands.Blame` the producers' requeue carries,
    without the dead processor's name and end, which only the daemon knows."""
    if len(raw) < HEADER.size:
        return None
    magic, state, count, frame_size = HEADER.unpack_from(raw, 0)
    if magic != MAGIC or state not in KINDS:
        return None
    if state == PACKED_MESSAGE:
        suspect = _packed_suspect(raw)
        return None if suspect is None else Blame(KINDS[state], (suspect,), 1)
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


def _packed_suspect(raw: bytes) -> Suspect | None:
    """The event at the recorded index of the recorded frame, or None if torn."""
    if len(raw) < PACKED_AT + PACKED.size:
        return None
    n, index = PACKED.unpack_from(raw, PACKED_AT)
    start = PACKED_AT + PACKED.size
    if n > PACKED_MAX or start + n > len(raw):
        return None
    try:
        block = protocol.open_events(raw[start:start + n])
    except protocol.ProtocolError:
        return None
    if index >= len(block):
        return None
    event = block[index]
    producer, token = protocol.event_origin(event), protocol.event_token(event)
    if not (isinstance(producer, int) and isinstance(token, int)
            and 0 <= producer < 2**16 and 0 <= token < 2**64):
        return None
    msg_id = protocol.event_id(event)
    return Suspect(producer, token, msg_id if isinstance(msg_id, str) else str(msg_id))


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
        raw = b"".join(iter(lambda: os.read(fd, FILE_SIZE), b""))
    except OSError:
        return None
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(file_path)
    try:
        return parse(raw)
    except (struct.error, UnicodeError):
        return None
