"""Reading a spool file into lines: one file's reading state, and whole lines out of
chunks of ``READ_SIZE`` bytes.

A line longer than ``max_message_bytes`` is never held whole: once the bytes without a
newline pass the limit they are dropped as they are read, up to the line's end, and an
:class:`Oversized` marker takes the line's place (it fails with its size; the line itself
stays in the file, moved to ``done_dir``).  Lines are decoded once per block, and per line
only when the block is not UTF-8 (a line that is not UTF-8 stays ``bytes`` and fails
alone, with a clear reason).
"""

from __future__ import annotations

import logging
from typing import Any

from .ledger import Ranges, SettledCursor

log = logging.getLogger("offbroadway.sources.spool")

READ_SIZE = 1 << 20            # bytes per read(): big enough that per-read cost vanishes
# A handle is one int, ``file order << LINE_BITS | line number``: no per-message tuple for
# the garbage collector to trace while thousands of messages are in flight, and sorting
# handles puts them in file and line order.
LINE_BITS = 40
LINE_MASK = (1 << LINE_BITS) - 1


class Oversized:
    """Stands in for a line over ``max_message_bytes``, which is never held in memory whole:
    its size and where it starts in the file, so the dead letter can say where it is."""

    __slots__ = ("offset", "size")

    def __init__(self, size: int, offset: int) -> None:
        self.size = size
        self.offset = offset


class SpoolFile:
    """Reading position and unsettled lines of one spool file this producer owns."""

    __slots__ = ("broken", "eof", "fh", "head", "ino", "key", "lineno", "lines", "name",
                 "offset", "order", "outstanding", "parts", "parts_len", "path", "pos",
                 "record_fd", "record_path", "regrown_at", "settled_before", "skipping",
                 "skipping_from")

    def __init__(self, name: str, path: str, order: int, ino: int, head: str,
                 record_path: str, settled: Ranges) -> None:
        self.name = name
        self.path = path
        self.order = order                 # discovery order: requeued lines keep file order
        self.key = order << LINE_BITS      # handle of line n is ``key | n``
        self.ino = ino
        self.head = head                   # fingerprint of its first bytes, for the record
        self.fh: Any = None                # open binary file while reading, else None
        self.offset = 0                    # bytes read from the file so far
        self.regrown_at = -1               # offset at which we last found it had grown
        self.parts: list[bytes] = []       # bytes read after the last newline
        self.parts_len = 0                 # their total length
        self.skipping: int | None = None   # bytes of an oversized line passed over so far
        self.skipping_from = 0             # where that line starts in the file
        self.lines: list[Any] = []         # decoded lines of the current chunk (str; bytes
        self.pos = 0                       #   for a line that is not valid UTF-8)
        self.lineno = 0                    # number of the last line taken from ``lines``
        self.eof = False
        self.broken = False                # could not be read: leave it (and its record) be
        # fetched (or requeued) and not yet settled: line number → its text, for requeue
        self.outstanding: dict[int, Any] = {}
        #: the lines an earlier run settled (its record), skipped while reading
        self.settled_before = SettledCursor(settled)
        self.record_fd: int | None = None
        self.record_path = record_path


class LineReader:
    """Fills a :class:`SpoolFile`'s ``lines`` chunk by chunk; counts what it read."""

    def __init__(self, max_message_bytes: int) -> None:
        self.limit = max_message_bytes
        self.bytes_read = 0
        self.oversized = 0
        self.file_errors = 0

    def fill(self, fs: SpoolFile) -> bool:
        """Read the next chunk of whole lines into ``fs.lines``; False at end of file, or
        when the file cannot be read (then ``fs.broken``: leave it, and its record, be)."""
        limit = self.limit
        try:
            if fs.fh is None:
                fs.fh = open(fs.path, "rb", buffering=0)
                fs.fh.seek(fs.offset)
            while True:
                chunk = fs.fh.read(READ_SIZE)
                if not chunk:
                    if fs.skipping is not None:      # an oversized last line, no newline
                        fs.lines, fs.pos = [self._marker(fs.skipping, fs.skipping_from)], 0
                        fs.skipping = None
                        return True
                    if not fs.parts:
                        return False
                    # a last line without a newline is still a line
                    tail, fs.parts, fs.parts_len = b"".join(fs.parts), [], 0
                    fs.lines, fs.pos = self._lines(tail, fs.offset - len(tail)), 0
                    return True
                start = fs.offset
                fs.offset += len(chunk)
                self.bytes_read += len(chunk)
                lead: list[Any] = []
                if fs.skipping is not None:
                    nl = chunk.find(b"\n")
                    if nl < 0:
                        fs.skipping += len(chunk)
                        continue
                    lead = [self._marker(fs.skipping + nl, fs.skipping_from)]
                    fs.skipping = None
                    chunk, start = chunk[nl + 1:], start + nl + 1
                cut = chunk.rfind(b"\n")
                if cut < 0:
                    if chunk:
                        fs.parts.append(chunk)
                        fs.parts_len += len(chunk)
                    if fs.parts_len > limit:         # no newline in sight: pass it over
                        fs.skipping, fs.skipping_from = fs.parts_len, fs.offset - fs.parts_len
                        fs.parts, fs.parts_len = [], 0
                    if lead:
                        fs.lines, fs.pos = lead, 0
                        return True
                    continue
                if fs.parts:
                    head = b"".join(fs.parts) + chunk[:cut]
                    start -= fs.parts_len
                else:
                    head = chunk[:cut]
                rest = chunk[cut + 1:]
                fs.parts, fs.parts_len = ([rest], len(rest)) if rest else ([], 0)
                lines = self._lines(head, start)
                fs.lines, fs.pos = (lead + lines if lead else lines), 0
                return True
        except OSError as exc:
            # vanished or unreadable: stop reading it in this process, keep its record
            self.file_errors += 1
            log.error("spool: cannot read %s: %s; skipping it until restart", fs.path, exc)
            fs.broken = True
            fs.parts, fs.parts_len, fs.skipping = [], 0, None
            return False

    def _marker(self, size: int, offset: int) -> Oversized:
        self.oversized += 1
        log.warning("spool: line of %d bytes at offset %d is over max_message_bytes (%d); "
                    "it fails without being read", size, offset, self.limit)
        return Oversized(size, offset)

    def _lines(self, block: bytes, start: int) -> list[Any]:
        """The block's lines, those over ``max_message_bytes`` replaced by markers."""
        lines = decode_lines(block, start == 0)
        limit = self.limit
        if len(block) <= limit:
            return lines                  # the common case: no line can be over the limit
        pos = 0
        for i in range(len(lines)):
            end = block.find(b"\n", pos)
            end = len(block) if end < 0 else end
            if end - pos > limit:
                lines[i] = self._marker(end - pos, start + pos)
            pos = end + 1
        return lines


def decode_lines(block: bytes, at_start: bool) -> list[Any]:
    """Split whole lines; decode once per block, and per line only if the block is not UTF-8
    (a line that is not UTF-8 stays ``bytes`` and fails alone, with a clear reason)."""
    if at_start and block.startswith(b"\xef\xbb\xbf"):
        block = block[3:]                             # a UTF-8 byte order mark
    try:
        text = block.decode("utf-8")
    except UnicodeDecodeError:
        pass
    else:
        lines = text.split("\n")
        if "\r" in text:                              # CRLF files: keep them on the fast path
            lines = [line.removesuffix("\r") for line in lines]
        return lines
    out: list[Any] = []
    for raw in block.split(b"\n"):
        try:
            out.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            out.append(raw)
    return out
