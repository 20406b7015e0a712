"""The ``spool`` source: a directory of JSON Lines files, the default that needs no server.

Each non-blank line of a ``*.jsonl`` file in ``path`` is one message: ``data`` is the parsed
JSON value, ``metadata`` is ``{"file": name, "line": n}`` (1-based) and the id is
``"<file>:<line>"``.  A line that is not JSON is still delivered, with
``metadata["error"]`` saying why, so it fails visibly through ``handle_failed``.

Durability is the point of this module.  Settled lines (acked, or failed and written to the
dead letter file) are appended to ``<state_dir>/spool/<file>.acked`` and fsync'd once per
``ack``/``fail`` call and file: once per frame of acks, not per line.  A producer that
restarts, even after SIGKILL, skips exactly the lines recorded there: nothing acknowledged
is read twice, and anything fetched but not recorded is read again (at-least-once).  When every
line of a file is settled the file is moved to ``done_dir`` and its record removed.

The record is a text file: a header with a fingerprint of the file's first bytes (so a stale
record can never swallow a new file that reuses the name: an inode number cannot tell, the
filesystem hands a deleted file's inode straight to the next new file), then one line per
settle call of line numbers and ranges (``"1-50 52 54-60"``), and a final ``#done`` just
before the file is moved away.
A torn last line (a crash mid-write) is cut off on load; its lines are simply read again.

Files are split among producers by ``crc32(name) % producer_count``, so no line goes to two
producers, and a file's record is keyed by its name alone, so changing the number of
producers between runs keeps every record valid.

Spool files must be complete when they appear under a name matching ``pattern``: write them
under another name (``x.jsonl.tmp``) and rename them in.  A file that grows after being read
to its end is read on before being moved, but a file that is still being written when its
last line is settled may be moved before the rest arrives.

Options: ``path`` (required), ``pattern`` (default ``"*.jsonl"``), ``done_dir`` (default
``<path>/done``; relative to ``path``), ``scan_interval`` (seconds between directory rescans
when idle, default 1.0).
"""

from __future__ import annotations

import json
import logging
import os
import time
import zlib
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from typing import Any

from .base import (
    Failure,
    Item,
    Source,
    SourceOptionError,
    option_float,
    option_max_message_bytes,
    option_str,
    oversized,
)

log = logging.getLogger("offbroadway.sources.spool")

READ_SIZE = 1 << 20            # bytes per read(): big enough that per-read cost vanishes
RECORD_SUFFIX = ".acked"
RECORD_HEADER = "#offbroadway-spool-acked v1"
DONE_MARK = "#done"
HEAD_BYTES = 4096              # fingerprinted to tell a file from another of the same name
DEAD_LETTER = "dead-letter.jsonl"
_NEVER = float("inf")
# A handle is one int, ``file order << _LINE_BITS | line number``: no per-message tuple for
# the garbage collector to trace while thousands of messages are in flight, and sorting
# handles puts them in file and line order.
_LINE_BITS = 40
_LINE_MASK = (1 << _LINE_BITS) - 1
# parses one JSON value at an index, returning (value, end); raises StopIteration when no
# value starts there.  The C scanner when available (clears its memo after every call).
_scan_once = json.JSONDecoder().scan_once


class _Oversized:
    """Stands in for a line over ``max_message_bytes``, which is never held in memory whole:
    its size and where it starts in the file, so the dead letter can say where it is."""

    __slots__ = ("offset", "size")

    def __init__(self, size: int, offset: int) -> None:
        self.size = size
        self.offset = offset


class _File:
    """Reading position and unsettled lines of one spool file this producer owns."""

    __slots__ = ("broken", "eof", "fh", "head", "ino", "key", "lineno", "lines", "name",
                 "next_skip", "offset", "order", "outstanding", "parts", "parts_len", "path",
                 "pos", "record_fd", "record_path", "regrown_at", "skip_i", "skipping",
                 "skipping_from", "skips")

    def __init__(self, name: str, path: str, order: int, ino: int, head: str,
                 record_path: str) -> None:
        self.name = name
        self.path = path
        self.order = order                 # discovery order: requeued lines keep file order
        self.key = order << _LINE_BITS     # handle of line n is ``key | n``
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
        self.skips: list[tuple[int, int]] = []   # settled in an earlier run: merged ranges
        self.skip_i = 0
        self.next_skip = _NEVER            # first line number that may need skipping
        self.record_fd: int | None = None
        self.record_path = record_path


class SpoolSource(Source):
    """JSON Lines files in a directory, acked durably line by line; see the module doc."""

    name = "spool"
    known_options = frozenset({"path", "pattern", "done_dir", "scan_interval",
                               "max_message_bytes"})

    def __init__(self, options: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(options, **kwargs)
        opts = self.options
        self.path = os.path.abspath(option_str(self.name, opts, "path", None, required=True)
                                    or "")
        self.pattern: str = option_str(self.name, opts, "pattern", "*.jsonl") or "*.jsonl"
        done = option_str(self.name, opts, "done_dir", "done") or "done"
        self.done_dir = os.path.normpath(os.path.join(self.path, done))
        if self.done_dir == self.path:
            raise SourceOptionError("spool source: option 'done_dir' must not be 'path' "
                                    "itself, or finished files would be read again", "done_dir")
        self.scan_interval = option_float(self.name, opts, "scan_interval", 1.0)
        self.max_message_bytes = option_max_message_bytes(self.name, opts)
        if not self.state_dir:
            raise SourceOptionError("spool source: needs the runtime state_dir to record "
                                    "which lines were acknowledged")
        self.spool_state = os.path.join(os.path.abspath(self.state_dir), "spool")
        self._files: dict[str, _File] = {}   # tracked: being read, or read with lines unsettled
        self._by_order: dict[int, _File] = {}  # the same files, by handle prefix
        self._reading: list[_File] = []      # tracked and not at end of file, in order
        self._ignored: set[str] = set()      # names not to pick up again in this process
        self._requeued: list[int] = []       # handles to deliver again, sorted
        self._order = 0
        self._last_scan = -_NEVER
        self._dead_fd: int | None = None
        self._opened = False
        self._closed = False
        self.fetched = self.acked = self.failed = self.requeued = 0
        self.invalid = self.skipped = self.files_done = self.file_errors = 0
        self.bytes_read = 0
        self.oversized = 0

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        super().validate_options(options)
        option_str(cls.name, options, "path", None, required=True)
        pattern = option_str(cls.name, options, "pattern", "*.jsonl")
        if pattern and "/" in pattern:
            raise SourceOptionError(f"spool source: option 'pattern' matches file names in "
                                    f"'path', so it cannot contain '/': {pattern!r}", "pattern")
        option_str(cls.name, options, "done_dir", "done")
        option_float(cls.name, options, "scan_interval", 1.0)
        option_max_message_bytes(cls.name, options)

    @classmethod
    def preflight(cls, options: Mapping[str, Any]) -> list[str]:
        """The directory :meth:`open` reads must exist and be one (relative paths are taken
        from the working directory, as the producer will)."""
        path = os.path.abspath(str(options["path"]))
        if not os.path.exists(path):
            raise SourceOptionError(f"spool source: option 'path': {path!r} does not exist "
                                    f"(create the directory the spool files arrive in)", "path")
        if not os.path.isdir(path):
            raise SourceOptionError(f"spool source: option 'path': {path!r} is not a "
                                    f"directory", "path")
        if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
            raise SourceOptionError(f"spool source: option 'path': {path!r} is not readable "
                                    f"and writable by uid {os.getuid()} (finished files are "
                                    f"moved out of it)", "path")
        return []

    # -- lifecycle ----------------------------------------------------------------------------
    def open(self) -> None:
        if not os.path.isdir(self.path):
            raise SourceOptionError(f"spool source: option 'path': {self.path!r} is not a "
                                    f"directory", "path")
        os.makedirs(self.spool_state, mode=0o700, exist_ok=True)
        self._remove_finished_records()
        self._opened = True
        self._scan()

    def close(self) -> None:
        self._closed = True
        for fs in self._files.values():
            self._close_file(fs)
        self._files.clear()
        self._by_order.clear()
        self._reading.clear()
        self._requeued.clear()
        if self._dead_fd is not None:
            os.close(self._dead_fd)
            self._dead_fd = None

    # -- fetching -----------------------------------------------------------------------------
    def fetch(self, n: int) -> list[Item]:
        if n <= 0 or self._closed or not self._opened:
            return []
        out: list[Item] = []
        if self._requeued:
            take, self._requeued = self._requeued[:n], self._requeued[n:]
            for handle in take:
                fs = self._by_order.get(handle >> _LINE_BITS)
                lineno = handle & _LINE_MASK
                if fs is not None and lineno in fs.outstanding:  # not settled meanwhile
                    out.append(self._item(fs, lineno, fs.outstanding[lineno]))
        scanned = False
        while len(out) < n:
            if not self._reading:
                if scanned or not self._scan_due():
                    break
                scanned = True
                self._scan()
                continue
            self._read(self._reading[0], n - len(out), out)
        self.fetched += len(out)
        return out

    def _read(self, fs: _File, want: int, out: list[Item]) -> None:
        """Append up to ``want`` messages from ``fs``; at its end, take it off ``_reading``."""
        name = fs.name
        key = fs.key
        scan = _scan_once
        outstanding = fs.outstanding
        append = out.append
        while want > 0:
            if fs.pos >= len(fs.lines) and not self._fill(fs):
                self._at_eof(fs)
                return
            lines = fs.lines
            pos = fs.pos
            end = min(len(lines), pos + want)
            lineno = fs.lineno
            next_skip = fs.next_skip
            produced = 0
            for raw in lines[pos:end]:
                lineno += 1
                if lineno >= next_skip:
                    skip = self._settled_before(fs, lineno)
                    next_skip = fs.next_skip
                    if skip:
                        self.skipped += 1
                        continue
                # the decoder's C scanner, without json.loads' per-call Python overhead
                # (twice the lines per second); anything unusual takes the slow path
                try:
                    data, stop = scan(raw, 0)
                    if stop != len(raw):
                        raise ValueError
                except (StopIteration, ValueError, TypeError, RecursionError):
                    if raw.__class__ is not _Oversized and not raw.strip():
                        continue                      # blank lines are not messages
                    append(self._item(fs, lineno, raw))
                else:
                    append((f"{name}:{lineno}", data, {"file": name, "line": lineno},
                            key | lineno))
                outstanding[lineno] = raw
                produced += 1
            fs.pos = end
            fs.lineno = lineno
            want -= produced

    def _item(self, fs: _File, lineno: int, raw: Any) -> Item:
        """One message from a line: the slow path, for requeued lines, lines with
        surrounding whitespace, and lines that are not JSON (with the decoder's reason)."""
        meta: dict[str, Any] = {"file": fs.name, "line": lineno}
        if isinstance(raw, _Oversized):
            meta["error"] = oversized(raw.size, self.max_message_bytes, "line")
            meta["line_bytes"] = raw.size
            return (f"{fs.name}:{lineno}", None, meta, fs.key | lineno)
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            self.invalid += 1
            if isinstance(raw, bytes):
                data = raw.decode("utf-8", "replace")
                meta["error"] = f"line is not valid UTF-8: {exc}"
            else:
                data = raw
                meta["error"] = f"line is not valid JSON: {exc}"
        return (f"{fs.name}:{lineno}", data, meta, fs.key | lineno)

    @staticmethod
    def _settled_before(fs: _File, lineno: int) -> bool:
        """Is ``lineno`` in a range recorded by an earlier run?  Moves the skip cursor on."""
        skips = fs.skips
        i = fs.skip_i
        while i < len(skips) and skips[i][1] < lineno:
            i += 1
        fs.skip_i = i
        if i == len(skips):
            fs.next_skip = _NEVER
            return False
        fs.next_skip = skips[i][0]
        return skips[i][0] <= lineno

    def _fill(self, fs: _File) -> bool:
        """Read the next chunk of whole lines into ``fs.lines``; False at end of file.

        A line longer than ``max_message_bytes`` is never held whole: once the bytes
        without a newline pass the limit they are dropped as they are read, up to the
        line's end, and an :class:`_Oversized` marker takes the line's place (it fails
        with its size; the line itself stays in the file, moved to ``done_dir``).
        """
        limit = self.max_message_bytes
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
            self._ignored.add(fs.name)
            fs.broken = True
            fs.parts, fs.parts_len, fs.skipping = [], 0, None
            return False

    def _marker(self, size: int, offset: int) -> _Oversized:
        self.oversized += 1
        log.warning("spool: line of %d bytes at offset %d is over max_message_bytes (%d); "
                    "it fails without being read", size, offset, self.max_message_bytes)
        return _Oversized(size, offset)

    def _lines(self, block: bytes, start: int) -> list[Any]:
        """The block's lines, those over ``max_message_bytes`` replaced by markers."""
        lines = _decode_lines(block, start == 0)
        limit = self.max_message_bytes
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

    def _at_eof(self, fs: _File) -> None:
        fs.eof = True
        fs.lines, fs.pos = [], 0
        if fs.fh is not None:
            fs.fh.close()
            fs.fh = None
        if self._reading and self._reading[0] is fs:
            self._reading.pop(0)
        elif fs in self._reading:
            self._reading.remove(fs)
        if not fs.outstanding:
            self._finish(fs)

    # -- settling -----------------------------------------------------------------------------
    def ack(self, handles: list[Any]) -> None:
        groups = self._group(handles)
        for fs, lines in groups.items():
            self.acked += len(self._settle(fs, lines))
        self._finish_settled(groups)

    def fail(self, failures: list[Failure]) -> None:
        """Failure policy: dead-letter.  The line goes to ``<state_dir>/spool/dead-letter
        .jsonl`` (fsync'd) before it is recorded as settled, so a crash in between can
        only write it there twice, never lose it."""
        entries = []
        handles = []
        now = time.time()
        for handle, reason in failures:
            fs = self._by_order.get(handle >> _LINE_BITS)
            lineno = handle & _LINE_MASK
            if fs is None or lineno not in fs.outstanding or self._closed:
                continue
            raw = fs.outstanding[lineno]
            entry = {"file": fs.name, "line": lineno, "reason": str(reason)}
            if isinstance(raw, _Oversized):
                # not copied: it stays in the file (moved to done_dir), found by offset
                entry.update(text=None, bytes=raw.size, offset=raw.offset,
                             moved_to=self.done_dir)
            else:
                entry["text"] = raw.decode("utf-8", "replace") if isinstance(raw, bytes) \
                    else raw
            entry.update(pipeline=self.pipeline, producer=self.producer_index, failed_at=now)
            entries.append(json.dumps(entry, ensure_ascii=False))
            handles.append(handle)
        if not entries:
            return
        if self._dead_fd is None:
            path = os.path.join(self.spool_state, DEAD_LETTER)
            self._dead_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        # one write() of whole lines: appends from several producers do not interleave
        _write_all(self._dead_fd, ("\n".join(entries) + "\n").encode())
        os.fdatasync(self._dead_fd)
        groups = self._group(handles)
        for fs, lines in groups.items():
            self.failed += len(self._settle(fs, lines))
        self._finish_settled(groups)

    def _settle(self, fs: _File, lines: list[int]) -> list[int]:
        """Record ``lines`` of ``fs`` durably as settled; return those that were unsettled."""
        if self._closed:
            return []
        outstanding = fs.outstanding
        settled = sorted(line for line in set(lines) if line in outstanding)
        if not settled:
            return []
        self._append_record(fs, _ranges(settled) + "\n")
        for line in settled:
            del outstanding[line]
        return settled

    def _group(self, handles: Iterable[int]) -> dict[_File, list[int]]:
        """Handles → line numbers per tracked file (handles of forgotten files are dropped)."""
        groups: dict[_File, list[int]] = {}
        by_order = self._by_order
        for h in handles:
            fs = by_order.get(h >> _LINE_BITS)
            if fs is None:
                continue
            lst = groups.get(fs)
            if lst is None:
                groups[fs] = [h & _LINE_MASK]
            else:
                lst.append(h & _LINE_MASK)
        return groups

    def _finish_settled(self, groups: Mapping[_File, list[int]]) -> None:
        for fs in list(groups):
            if fs.eof and not fs.outstanding and self._files.get(fs.name) is fs:
                self._finish(fs)

    def requeue(self, handles: list[Any]) -> None:
        if self._closed:
            return
        back = [h for fs, lines in self._group(handles).items()
                for h in (fs.key | n for n in lines if n in fs.outstanding)]
        if not back:
            return
        self.requeued += len(back)
        self._requeued = sorted(set(self._requeued).union(back))

    # -- idleness -----------------------------------------------------------------------------
    def exhausted(self) -> bool:
        if self._requeued:
            return False
        if not self._reading and self._opened and not self._closed and self._scan_due():
            self._scan()
        return not self._reading

    def retry_after(self) -> float:
        if self._requeued or self._reading:
            return 0.0
        return max(0.01, self._last_scan + self.scan_interval - time.monotonic())

    def stats(self) -> dict[str, Any]:
        unacked = sum(len(fs.outstanding) for fs in self._files.values())
        return {"source": self.name, "fetched": self.fetched, "acked": self.acked,
                "failed": self.failed, "requeued": self.requeued, "unacked": unacked,
                "failed_to": os.path.join(self.spool_state, DEAD_LETTER),
                "requeue_waiting": len(self._requeued), "invalid": self.invalid,
                "skipped_settled": self.skipped, "files_open": len(self._files),
                "files_reading": len(self._reading), "files_done": self.files_done,
                "file_errors": self.file_errors, "bytes_read": self.bytes_read,
                "oversized": self.oversized, "max_message_bytes": self.max_message_bytes,
                "exhausted": not self._requeued and not self._reading}

    # -- files: discovery, records, moving aside ----------------------------------------------
    def _owns(self, name: str) -> bool:
        return zlib.crc32(name.encode()) % self.producer_count == self.producer_index

    def _scan_due(self) -> bool:
        return time.monotonic() - self._last_scan >= self.scan_interval

    def _scan(self) -> None:
        """Pick up files this producer owns that it does not track yet, in name order."""
        self._last_scan = time.monotonic()
        try:
            with os.scandir(self.path) as it:
                names = [e.name for e in it
                         if e.name not in self._files and e.name not in self._ignored
                         and fnmatchcase(e.name, self.pattern) and e.is_file()
                         and self._owns(e.name)]
        except OSError as exc:
            self.file_errors += 1
            log.error("spool: cannot list %s: %s", self.path, exc)
            return
        for name in sorted(names):
            self._track(name)

    def _track(self, name: str) -> None:
        path = os.path.join(self.path, name)
        record_path = os.path.join(self.spool_state, name + RECORD_SUFFIX)
        try:
            ino = os.stat(path).st_ino
            head = _fingerprint(path)
            rec_head, ranges, _ = _load_record(record_path)
            if rec_head is not None and _fingerprint(path, rec_head) != rec_head:
                log.warning("spool: %s belongs to an earlier file named %s; removing it",
                            record_path, name)
                _unlink(record_path)
                ranges = []
        except OSError:
            return                                   # gone again: nothing to read
        self._order += 1
        fs = _File(name, path, self._order, ino, head, record_path)
        fs.skips = ranges
        fs.next_skip = ranges[0][0] if ranges else _NEVER
        self._files[name] = fs
        self._by_order[fs.order] = fs
        self._reading.append(fs)

    def _append_record(self, fs: _File, text: str) -> None:
        if fs.record_fd is None:
            fd = os.open(fs.record_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            fs.record_fd = fd
            if os.fstat(fd).st_size == 0:
                text = f"{RECORD_HEADER} head={fs.head}\n" + text
                _write_all(fd, text.encode())
                os.fdatasync(fd)
                _fsync_dir(self.spool_state)         # the new name must survive a crash too
                return
        _write_all(fs.record_fd, text.encode())
        os.fdatasync(fs.record_fd)

    def _finish(self, fs: _File) -> None:
        """Every line is settled: move the file to ``done_dir`` and drop its record.

        The record gets a ``#done`` mark first, so if we crash after the move a restart
        knows the leftover record is finished business and removes it.  A file that could
        not be read is left where it is, record and all, for the next run to try again.
        """
        if fs.broken:
            self._forget(fs, remove_record=False)
            return
        try:
            st = os.stat(fs.path)
        except FileNotFoundError:
            log.warning("spool: %s disappeared before it could be moved to %s", fs.path,
                        self.done_dir)
            self._forget(fs, remove_record=True)
            return
        if st.st_ino == fs.ino and st.st_size > fs.offset and fs.offset != fs.regrown_at:
            # it grew after we read to its end: read on before calling it done (once per
            # offset, so a file whose size and content disagree cannot loop us forever)
            fs.regrown_at = fs.offset
            fs.eof = False
            self._reading.append(fs)
            return
        try:
            if fs.record_fd is not None or os.path.exists(fs.record_path):
                self._append_record(fs, DONE_MARK + "\n")
            os.makedirs(self.done_dir, exist_ok=True)
            target = _move_aside(fs.path, self.done_dir, fs.name)
        except OSError as exc:
            self.file_errors += 1
            log.error("spool: cannot move finished %s to %s: %s; leaving it (its lines are "
                      "recorded as settled)", fs.path, self.done_dir, exc)
            self._ignored.add(fs.name)
            self._forget(fs, remove_record=False)
            return
        log.info("spool: %s finished; moved to %s", fs.name, target)
        self.files_done += 1
        self._forget(fs, remove_record=True)

    def _forget(self, fs: _File, *, remove_record: bool) -> None:
        self._close_file(fs)
        if remove_record:
            _unlink(fs.record_path)
        if self._files.get(fs.name) is fs:
            del self._files[fs.name]
        self._by_order.pop(fs.order, None)
        if fs in self._reading:
            self._reading.remove(fs)

    @staticmethod
    def _close_file(fs: _File) -> None:
        if fs.fh is not None:
            fs.fh.close()
            fs.fh = None
        if fs.record_fd is not None:
            os.close(fs.record_fd)
            fs.record_fd = None

    def _remove_finished_records(self) -> None:
        """Remove records marked ``#done`` whose file is gone: we crashed after moving it.

        Only records of files this producer owns, so producers starting together never
        touch each other's.  A record without the mark is kept even if its file is
        missing (a wrong ``path`` must not erase what was acknowledged).
        """
        try:
            names = os.listdir(self.spool_state)
        except OSError:
            return
        for rec in names:
            if not rec.endswith(RECORD_SUFFIX):
                continue
            name = rec[:-len(RECORD_SUFFIX)]
            if not self._owns(name) or os.path.exists(os.path.join(self.path, name)):
                continue
            _, _, done = _load_record(os.path.join(self.spool_state, rec))
            if done:
                _unlink(os.path.join(self.spool_state, rec))


# -- helpers -----------------------------------------------------------------------------------

def _decode_lines(block: bytes, at_start: bool) -> list[Any]:
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


def _ranges(sorted_lines: list[int]) -> str:
    """``[1, 2, 3, 5, 7, 8]`` → ``"1-3 5 7-8"``: acks come mostly in order, so this is short."""
    parts = []
    start = prev = sorted_lines[0]
    for n in sorted_lines[1:]:
        if n == prev + 1:
            prev = n
            continue
        parts.append(f"{start}-{prev}" if prev != start else str(start))
        start = prev = n
    parts.append(f"{start}-{prev}" if prev != start else str(start))
    return " ".join(parts)


def _fingerprint(path: str, like: str | None = None) -> str:
    """``"<crc32>:<length>"`` of the file's first bytes: as many as ``like`` covered, else up
    to ``HEAD_BYTES``.  Appending to a file keeps its fingerprint; replacing it does not."""
    length = int(like.partition(":")[2] or 0) if like else HEAD_BYTES
    with open(path, "rb") as f:
        head = f.read(length)
    return f"{zlib.crc32(head)}:{len(head)}"


def _load_record(path: str) -> tuple[str | None, list[tuple[int, int]], bool]:
    """(fingerprint named in the header, merged settled ranges, has the ``#done`` mark).

    A torn last line is cut off the file, so the next append starts on a fresh line.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None, [], False
    if raw and not raw.endswith(b"\n"):
        cut = raw.rfind(b"\n") + 1
        log.warning("spool: %s ends in a torn write; cutting %d bytes", path, len(raw) - cut)
        os.truncate(path, cut)
        raw = raw[:cut]
    head: str | None = None
    done = False
    ranges: list[tuple[int, int]] = []
    for line in raw.decode("utf-8", "replace").splitlines():
        if line.startswith("#"):
            if line.startswith(RECORD_HEADER):
                for field in line.split()[2:]:
                    key, _, value = field.partition("=")
                    if key == "head" and value.partition(":")[2].isdigit():
                        head = value
            elif line.strip() == DONE_MARK:
                done = True
            continue
        for token in line.split():
            a, _, b = token.partition("-")
            try:
                lo = int(a)
                hi = int(b) if b else lo
            except ValueError:
                log.warning("spool: %s: ignoring unreadable entry %r", path, token)
                continue
            if 0 < lo <= hi:
                ranges.append((lo, hi))
    ranges.sort()
    merged: list[tuple[int, int]] = []
    for lo, hi in ranges:
        if merged and lo <= merged[-1][1] + 1:
            if hi > merged[-1][1]:
                merged[-1] = (merged[-1][0], hi)
        else:
            merged.append((lo, hi))
    return head, merged, done


def _move_aside(path: str, done_dir: str, name: str) -> str:
    """Move ``path`` into ``done_dir`` without ever overwriting an earlier file there."""
    stem, ext = os.path.splitext(name)
    src_dir = os.path.dirname(path)
    for k in range(10_000):
        target = os.path.join(done_dir, name if k == 0 else f"{stem}.{k}{ext}")
        try:
            os.link(path, target)                     # fails if target exists: no overwrite
        except FileExistsError:
            continue
        except OSError:
            # no hard links here (another filesystem, or one without them)
            if os.path.exists(target):
                continue
            import shutil
            shutil.move(path, target)
            break
        os.unlink(path)
        break
    else:
        raise OSError(f"no free name for {name} in {done_dir}")
    _fsync_dir(done_dir)
    _fsync_dir(src_dir)
    return target


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
