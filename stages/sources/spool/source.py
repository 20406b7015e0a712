"""The ``spool`` source as the producer drives it: files found, read, settled, moved aside.

Each non-blank line of a ``*.jsonl`` file in ``path`` is one message: ``data`` is the parsed
JSON value, ``metadata`` is ``{"file": name, "line": n}`` (1-based) and the id is
``"<file>:<line>"``.  A line that is not JSON is still delivered, failed
(a ``FailedItem`` saying why), so it fails visibly through ``handle_failed``.

Durability is the point.  Settled lines (acked, or failed and written to the dead letter
file, :mod:`.deadletter`) are recorded in the file's ack ledger (:mod:`.ledger`,
:mod:`.record`) before ``ack``/``fail`` returns.  A producer that restarts, even after
SIGKILL, skips exactly the lines recorded there: nothing acknowledged is read twice, and
anything fetched but not recorded is read again (at-least-once).  When every line of a
file is settled the file is moved to ``done_dir`` and its record removed.

Files are split among producers by ``crc32(name) % producer_count``, so no line goes to two
producers, and a file's record is keyed by its name alone, so changing the number of
producers between runs keeps every record valid.

Spool files must be complete when they appear under a name matching ``pattern``: write them
under another name (``x.jsonl.tmp``) and rename them in.  A file that grows after being read
to its end is read on before being moved, but a file that is still being written when its
last line is settled may be moved before the rest arrives.
"""

from __future__ import annotations

import logging
import os
import time
import zlib
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from ..base import FailedItem, Failure, Item, Source, SourceOptionError, oversized
from ..decode import DECODE_ERRORS, fast_json, json_value
from . import record
from .deadletter import DeadLetters
from .files import move_aside, unlink
from .ledger import DONE_MARK, ranges_line
from .reader import LINE_BITS, LINE_MASK, LineReader, Oversized, SpoolFile
from .record import RECORD_SUFFIX
from .settings import KNOWN_OPTIONS, NAME, parse_options
from .stall import Stall, is_full

if TYPE_CHECKING:
    from .replay import SpoolDeadLetters

log = logging.getLogger("offbroadway.sources.spool")

_NEVER = float("inf")


class SpoolSource(Source):
    """JSON Lines files in a directory, acked durably line by line; see the module doc."""

    name = NAME
    known_options = KNOWN_OPTIONS

    def __init__(self, options: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(options, **kwargs)
        s = parse_options(self.options)
        self.path, self.pattern, self.done_dir = s.path, s.pattern, s.done_dir
        self.scan_interval, self.max_message_bytes = s.scan_interval, s.max_message_bytes
        if not self.state_dir:
            raise SourceOptionError("spool source: needs the runtime state_dir to record "
                                    "which lines were acknowledged")
        self.spool_state = os.path.join(os.path.abspath(self.state_dir), "spool")
        self._files: dict[str, SpoolFile] = {}   # tracked: being read, or read with lines unsettled
        self._by_order: dict[int, SpoolFile] = {}  # the same files, by handle prefix
        self._reading: list[SpoolFile] = []      # tracked and not at end of file, in order
        self._ignored: set[str] = set()      # names not to pick up again in this process
        self._requeued: list[int] = []       # handles to deliver again, sorted
        self._order = 0
        self._last_scan = -_NEVER
        self._dead = DeadLetters(self.spool_state)
        #: writes a full disk refused, retried with back-off (:mod:`.stall`)
        self._stall = Stall()
        self._finishing: set[str] = set()    # files whose move to done_dir is held
        self._reader = LineReader(self.max_message_bytes)
        self._opened = False
        self._closed = False
        self.fetched = self.acked = self.failed = self.requeued = 0
        self.invalid = self.skipped = self.files_done = 0

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        super().validate_options(options)
        parse_options(options)

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

    @classmethod
    def dead_letters(cls, options: Mapping[str, Any], *, pipeline: str,
                     state_dir: str) -> SpoolDeadLetters:
        from .replay import SpoolDeadLetters

        return SpoolDeadLetters(options, state_dir)

    @classmethod
    def nothing_to_read(cls, options: Mapping[str, Any]) -> str | None:
        """No file in ``path`` matches ``pattern``: nothing to deliver, and nothing owed
        either (an unsettled line lives in a file that is still there).  Says where the
        files read before went, since that is the usual reason (a second run)."""
        s = parse_options(options)
        try:
            with os.scandir(s.path) as it:
                if any(fnmatchcase(e.name, s.pattern) and e.is_file() for e in it):
                    return None
            with os.scandir(s.done_dir) as it:
                done = sum(1 for e in it if e.is_file())
        except FileNotFoundError:
            done = 0
        except OSError:
            return None
        said = f"no file matching {s.pattern!r} in {s.path}"
        if done:
            said += (f"; the {done} file(s) read before were moved to {s.done_dir} "
                     f"(move one back, or add new files, to read them)")
        return said

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
        self._dead.close()

    # -- fetching -----------------------------------------------------------------------------
    def fetch(self, n: int) -> list[Item]:
        if n <= 0 or self._closed or not self._opened:
            return []
        if self._stall:
            self._stall.retry()
            if self._stall:
                return []        # nothing new while settled lines cannot be recorded
        out: list[Item] = []
        if self._requeued:
            take, self._requeued = self._requeued[:n], self._requeued[n:]
            for handle in take:
                fs = self._by_order.get(handle >> LINE_BITS)
                lineno = handle & LINE_MASK
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

    def _read(self, fs: SpoolFile, want: int, out: list[Item]) -> None:
        """Append up to ``want`` messages from ``fs``; at its end, take it off ``_reading``."""
        name = fs.name
        key = fs.key
        loads = fast_json
        outstanding = fs.outstanding
        append = out.append
        while want > 0:
            if fs.pos >= len(fs.lines) and not self._reader.fill(fs):
                if fs.broken:
                    self._ignored.add(fs.name)
                self._at_eof(fs)
                return
            lines = fs.lines
            pos = fs.pos
            end = min(len(lines), pos + want)
            lineno = fs.lineno
            settled_before = fs.settled_before
            next_skip = settled_before.next_skip
            produced = 0
            for raw in lines[pos:end]:
                lineno += 1
                if lineno >= next_skip:
                    skip = settled_before.settled(lineno)
                    next_skip = settled_before.next_skip
                    if skip:
                        self.skipped += 1
                        continue
                # msgspec's decoder (about three times the lines per second of json's C
                # scanner); whatever it refuses takes the slow path, where json decides
                try:
                    data = loads(raw)
                except (ValueError, TypeError, RecursionError):
                    if raw.__class__ is not Oversized and not raw.strip():
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

    def _item(self, fs: SpoolFile, lineno: int, raw: Any) -> Item:
        """One message from a line: the slow path, for requeued lines, lines the fast
        decoder refuses, and lines that are not JSON (with ``json``'s reason)."""
        meta: dict[str, Any] = {"file": fs.name, "line": lineno}
        msg_id, handle = f"{fs.name}:{lineno}", fs.key | lineno
        if isinstance(raw, Oversized):
            meta["line_bytes"] = raw.size
            return FailedItem(msg_id, None, meta, handle,
                              oversized(raw.size, self.max_message_bytes, "line"))
        try:
            data = json_value(raw)
        except DECODE_ERRORS as exc:
            self.invalid += 1
            if isinstance(raw, bytes):
                return FailedItem(msg_id, raw.decode("utf-8", "replace"), meta, handle,
                                  f"line is not valid UTF-8: {exc}")
            return FailedItem(msg_id, raw, meta, handle, f"line is not valid JSON: {exc}")
        return (msg_id, data, meta, handle)

    def _at_eof(self, fs: SpoolFile) -> None:
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

        def settle() -> None:     # again from the start after a refusal: _settle skips
            for fs, lines in groups.items():   # what is recorded already
                self.acked += len(self._settle(fs, lines))
            self._finish_settled(groups)
        self._stall.run(f"record acknowledged lines in {self.spool_state}", settle)

    def fail(self, failures: list[Failure]) -> None:
        """Failure policy: dead-letter (:mod:`.deadletter`), before the lines are
        recorded as settled."""
        entries = []
        handles = []
        now = time.time()
        for handle, reason in failures:
            fs = self._by_order.get(handle >> LINE_BITS)
            lineno = handle & LINE_MASK
            if fs is None or lineno not in fs.outstanding or self._closed:
                continue
            raw = fs.outstanding[lineno]
            entry = {"file": fs.name, "line": lineno, "reason": str(reason)}
            if isinstance(raw, Oversized):
                # not copied: it stays in the file (moved to done_dir), found by offset
                entry.update(text=None, bytes=raw.size, offset=raw.offset,
                             moved_to=self.done_dir)
            else:
                entry["text"] = raw.decode("utf-8", "replace") if isinstance(raw, bytes) \
                    else raw
            entry.update(pipeline=self.pipeline, producer=self.producer_index, failed_at=now)
            entries.append(entry)
            handles.append(handle)
        if not entries:
            return
        groups = self._group(handles)
        written = False

        def settle() -> None:     # the dead letters once, then the records
            nonlocal written
            if not written:
                self._dead.write(entries)
                written = True
            for fs, lines in groups.items():
                self.failed += len(self._settle(fs, lines))
            self._finish_settled(groups)
        self._stall.run(f"write dead letters to {self._dead.path}", settle)

    def _settle(self, fs: SpoolFile, lines: list[int]) -> list[int]:
        """Record ``lines`` of ``fs`` durably as settled; return those that were unsettled."""
        if self._closed:
            return []
        outstanding = fs.outstanding
        settled = sorted(line for line in set(lines) if line in outstanding)
        if not settled:
            return []
        self._append_record(fs, ranges_line(settled))
        for line in settled:
            del outstanding[line]
        return settled

    def _group(self, handles: Iterable[int]) -> dict[SpoolFile, list[int]]:
        """Handles → line numbers per tracked file (handles of forgotten files are dropped)."""
        groups: dict[SpoolFile, list[int]] = {}
        by_order = self._by_order
        for h in handles:
            fs = by_order.get(h >> LINE_BITS)
            if fs is None:
                continue
            lst = groups.get(fs)
            if lst is None:
                groups[fs] = [h & LINE_MASK]
            else:
                lst.append(h & LINE_MASK)
        return groups

    def _finish_settled(self, groups: Mapping[SpoolFile, list[int]]) -> None:
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
        if self._requeued or self._stall:
            return False
        if not self._reading and self._opened and not self._closed and self._scan_due():
            self._scan()
        return not self._reading

    def retry_after(self) -> float:
        if self._stall:
            return self._stall.wait()
        if self._requeued or self._reading:
            return 0.0
        return max(0.01, self._last_scan + self.scan_interval - time.monotonic())

    def stats(self) -> dict[str, Any]:
        unacked = sum(len(fs.outstanding) for fs in self._files.values())
        return {"source": self.name, "fetched": self.fetched, "acked": self.acked,
                "failed": self.failed, "requeued": self.requeued, "unacked": unacked,
                "failed_to": self._dead.path,
                "requeue_waiting": len(self._requeued), "invalid": self.invalid,
                "skipped_settled": self.skipped, "files_open": len(self._files),
                "files_reading": len(self._reading), "files_done": self.files_done,
                "file_errors": self._reader.file_errors,
                "bytes_read": self._reader.bytes_read, "oversized": self._reader.oversized,
                "max_message_bytes": self.max_message_bytes,
                "disk_full_episodes": self._stall.episodes,
                "exhausted": not self._requeued and not self._reading and not self._stall,
                # a full disk shows as a source that is not there (status, the gauge)
                **({"state": "disk full", "last_error": self._stall.error}
                   if self._stall else {})}

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
            self._reader.file_errors += 1
            log.error("spool: cannot list %s: %s", self.path, exc)
            return
        for name in sorted(names):
            self._track(name)

    def _track(self, name: str) -> None:
        path = os.path.join(self.path, name)
        record_path = os.path.join(self.spool_state, name + RECORD_SUFFIX)
        try:
            ino = os.stat(path).st_ino
            head = record.fingerprint(path)
            rec = record.load(record_path)
            ranges = rec.ranges
            if rec.head is not None and record.fingerprint(path, rec.head) != rec.head:
                log.warning("spool: %s belongs to an earlier file named %s; removing it",
                            record_path, name)
                unlink(record_path)
                ranges = []
        except OSError:
            return                                   # gone again: nothing to read
        self._order += 1
        fs = SpoolFile(name, path, self._order, ino, head, record_path, ranges)
        self._files[name] = fs
        self._by_order[fs.order] = fs
        self._reading.append(fs)

    def _append_record(self, fs: SpoolFile, text: str) -> None:
        fs.record_fd = record.append(fs.record_fd, fs.record_path, fs.head, text)

    def _finish(self, fs: SpoolFile) -> None:
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
        if fs.name in self._finishing:
            return
        self._finishing.add(fs.name)
        self._stall.run(f"move finished {fs.name} to {self.done_dir}",
                        lambda: self._move_done(fs))

    def _move_done(self, fs: SpoolFile) -> None:
        """The move of :meth:`_finish`; a full disk raises (held and retried, nothing
        changed), any other error leaves the file where it is."""
        try:
            if fs.record_fd is not None or os.path.exists(fs.record_path):
                self._append_record(fs, DONE_MARK + "\n")
            os.makedirs(self.done_dir, exist_ok=True)
            target = move_aside(fs.path, self.done_dir, fs.name)
        except OSError as exc:
            if is_full(exc):
                raise
            self._finishing.discard(fs.name)
            self._reader.file_errors += 1
            log.error("spool: cannot move finished %s to %s: %s; leaving it (its lines are "
                      "recorded as settled)", fs.path, self.done_dir, exc)
            self._ignored.add(fs.name)
            self._forget(fs, remove_record=False)
            return
        self._finishing.discard(fs.name)
        log.info("spool: %s finished; moved to %s", fs.name, target)
        self.files_done += 1
        self._forget(fs, remove_record=True)

    def _forget(self, fs: SpoolFile, *, remove_record: bool) -> None:
        self._close_file(fs)
        if remove_record:
            unlink(fs.record_path)
        if self._files.get(fs.name) is fs:
            del self._files[fs.name]
        self._by_order.pop(fs.order, None)
        if fs in self._reading:
            self._reading.remove(fs)

    @staticmethod
    def _close_file(fs: SpoolFile) -> None:
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
            if record.load(os.path.join(self.spool_state, rec)).done:
                unlink(os.path.join(self.spool_state, rec))

