"""The spool's durable ack ledger as text: what a record says, written and read back.

Pure (no files): :mod:`.record` is the shell that reads, repairs and appends record files.

A record is ``<state_dir>/spool/<file>.acked``: a header with a fingerprint of the spool
file's first bytes (so a stale record can never swallow a new file that reuses the name:
an inode number cannot tell, the filesystem hands a deleted file's inode straight to the
next new file), then one line per settle call of line numbers and ranges
(``"1-50 52 54-60"``), and a final ``#done`` just before the file is moved away.  A torn
last line (a crash mid-write) is cut off on load; its lines are simply read again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

RECORD_HEADER = "#offbroadway-spool-acked v1"
DONE_MARK = "#done"
_NEVER = float("inf")

#: merged, sorted, disjoint and non-adjacent ``(first, last)`` line ranges, both included
Ranges = list[tuple[int, int]]


def header(head: str) -> str:
    """The record's first line, naming the fingerprint of the file it belongs to."""
    return f"{RECORD_HEADER} head={head}\n"


def ranges_line(sorted_lines: list[int]) -> str:
    """``[1, 2, 3, 5, 7, 8]`` → ``"1-3 5 7-8\\n"``: acks come mostly in order, so this is
    short.  ``sorted_lines`` is sorted, without duplicates, and not empty."""
    parts = []
    start = prev = sorted_lines[0]
    for n in sorted_lines[1:]:
        if n == prev + 1:
            prev = n
            continue
        parts.append(f"{start}-{prev}" if prev != start else str(start))
        start = prev = n
    parts.append(f"{start}-{prev}" if prev != start else str(start))
    return " ".join(parts) + "\n"


def merge(ranges: list[tuple[int, int]]) -> Ranges:
    """Overlapping and adjacent ranges joined, in order."""
    merged: Ranges = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            if hi > merged[-1][1]:
                merged[-1] = (merged[-1][0], hi)
        else:
            merged.append((lo, hi))
    return merged


@dataclass
class Record:
    """What a record file says."""

    #: the fingerprint named in the header (None: no header, or not one of ours)
    head: str | None = None
    ranges: Ranges = field(default_factory=list)
    done: bool = False
    #: bytes of the file that are whole lines; past them, a torn write to cut off
    whole: int = 0
    #: entries that are not line numbers or ranges (reported, then ignored)
    unreadable: list[str] = field(default_factory=list)


def parse(raw: bytes) -> Record:
    """A record file's bytes as a :class:`Record`; a torn last line is not read."""
    whole = len(raw) if not raw or raw.endswith(b"\n") else raw.rfind(b"\n") + 1
    out = Record(whole=whole)
    found: list[tuple[int, int]] = []
    for line in raw[:whole].decode("utf-8", "replace").splitlines():
        if line.startswith("#"):
            if line.startswith(RECORD_HEADER):
                for item in line.split()[2:]:
                    key, _, value = item.partition("=")
                    if key == "head" and value.partition(":")[2].isdigit():
                        out.head = value
            elif line.strip() == DONE_MARK:
                out.done = True
            continue
        for token in line.split():
            a, _, b = token.partition("-")
            try:
                lo = int(a)
                hi = int(b) if b else lo
            except ValueError:
                out.unreadable.append(token)
                continue
            if 0 < lo <= hi:
                found.append((lo, hi))
    out.ranges = merge(found)
    return out


class SettledCursor:
    """Which lines an earlier run settled, asked in increasing line order while a file is
    read: a cursor over the merged ranges, so the reader's hot loop only calls
    :meth:`settled` from :attr:`next_skip` on (the first line that may be settled)."""

    __slots__ = ("_i", "_ranges", "next_skip")

    def __init__(self, ranges: Ranges) -> None:
        self._ranges = ranges
        self._i = 0
        self.next_skip: float = ranges[0][0] if ranges else _NEVER

    def settled(self, lineno: int) -> bool:
        """Is ``lineno`` in a recorded range?  Moves the cursor on (line numbers asked
        never decrease)."""
        ranges = self._ranges
        i = self._i
        while i < len(ranges) and ranges[i][1] < lineno:
            i += 1
        self._i = i
        if i == len(ranges):
            self.next_skip = _NEVER
            return False
        self.next_skip = ranges[i][0]
        return ranges[i][0] <= lineno
