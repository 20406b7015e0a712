"""The spool's dead letters for ``offbroadway dead-letters``: read from the dead-letter file
(:mod:`.deadletter`), replayed as a new spool file in ``path``.

A replay writes the chosen lines, as they were read, to ``replay-<time>.jsonl`` in the
spool directory, where the producers pick it up like any other file (a running daemon
within ``scan_interval``, a stopped one at its next start); each line is a new message
(``replay-….jsonl:<n>``) and goes through the pipeline once.  The dead-letter file is
append-only (producers of a running daemon append to it), so replayed letters stay in it
and the command's record says which were replayed (``keeps_replayed``).

Crash-safe in three steps: the file is written under a name the spool does not read
(``.replay-<name>.part``) and fsync'd, the letters are recorded as replayed into that file,
then it is renamed in.  A crash before the record leaves a part file nobody recorded
(removed at the next replay, its letters replayed then); a crash after it leaves one that
was recorded (renamed in at the next replay).  Either way each letter reaches the spool
once.  The same line failed twice (a producer that crashed between the dead letter and
its ack record reads it again) is one letter: its key is the file, line and text.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any

from ..deadletters import DeadLetter, DeadLetterBox, Replayed
from .deadletter import DEAD_LETTER
from .files import write_all
from .settings import parse_options

PART_PREFIX, PART_SUFFIX = ".replay-", ".part"


def _key(entry: Mapping[str, Any]) -> str:
    text = entry.get("text")
    digest = hashlib.sha256(json.dumps([entry.get("file"), entry.get("line"), text])
                            .encode()).hexdigest()
    return f"{entry.get('file')}:{entry.get('line')}:{digest[:12]}"


class SpoolDeadLetters(DeadLetterBox):
    keeps_replayed = True

    def __init__(self, options: Mapping[str, Any], state_dir: str) -> None:
        s = parse_options(options)
        self.path, self.pattern = s.path, s.pattern
        self.file = os.path.join(os.path.abspath(state_dir), "spool", DEAD_LETTER)
        self.where = self.file

    def letters(self) -> list[DeadLetter]:
        out: dict[str, DeadLetter] = {}
        try:
            with open(self.file, encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return []
        for raw in lines:
            try:
                entry = json.loads(raw)
            except ValueError:
                continue           # a line cut by a crash mid-append: never acked, read again
            if not isinstance(entry, dict):
                continue
            key = _key(entry)
            if key in out:
                continue
            text = entry.get("text")
            origin = f"{entry.get('file')}:{entry.get('line')}"
            if text is None:
                origin += (f" ({entry.get('bytes')} bytes, not copied: at offset "
                           f"{entry.get('offset')} of the file in {entry.get('moved_to')})")
            out[key] = DeadLetter(key=key, reason=str(entry.get("reason", "")),
                                  failed_at=entry.get("failed_at"), origin=origin,
                                  body=text if isinstance(text, str) else None)
        return list(out.values())

    def _name(self) -> str:
        """A new file name the spool's ``pattern`` matches: ``replay-<time>-<pid>`` in
        place of its first ``*``."""
        tag = f"replay-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}"
        name = self.pattern.replace("*", tag, 1).replace("*", "").replace("?", "x")
        if "*" not in self.pattern or "[" in name or not fnmatchcase(name, self.pattern):
            raise ValueError(f"cannot name a replay file that the spool's pattern "
                             f"{self.pattern!r} matches; copy the lines yourself (show)")
        return name

    def _part_dir(self) -> str:
        """Where a replay file is written before it is renamed in: the spool directory,
        unless its pattern would read a half-written ``.replay-….part`` (then the spool's
        state directory, which must be on the same file system)."""
        if fnmatchcase(f"{PART_PREFIX}x{PART_SUFFIX}", self.pattern):
            return os.path.dirname(self.file)
        return self.path

    def _finish_interrupted(self, replayed: Replayed) -> list[str]:
        """Part files a crash left: rename in those recorded, remove the others."""
        done = []
        recorded = replayed.targets()
        try:
            names = os.listdir(self._part_dir())
        except OSError:
            return done
        for name in names:
            if not (name.startswith(PART_PREFIX) and name.endswith(PART_SUFFIX)):
                continue
            final = name[len(PART_PREFIX):-len(PART_SUFFIX)]
            part = os.path.join(self._part_dir(), name)
            if final in recorded:
                os.rename(part, os.path.join(self.path, final))
                done.append(final)
            else:
                os.unlink(part)
        return done

    def replay(self, letters: list[DeadLetter], replayed: Replayed) -> str:
        finished = self._finish_interrupted(replayed)
        note = (f" (and renamed in {', '.join(finished)}, which an interrupted replay had "
                f"recorded)" if finished else "")
        ready = [d for d in letters if d.body is not None]
        kept = len(letters) - len(ready)
        skipped = (f"; {kept} not replayable (too large to have been copied: they are in "
                   f"the finished files, see show)" if kept else "")
        if not ready:
            return f"nothing replayed{skipped}{note}"
        final = self._name()
        part = os.path.join(self._part_dir(), f"{PART_PREFIX}{final}{PART_SUFFIX}")
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            write_all(fd, "".join(d.body.rstrip("\n") + "\n" for d in ready
                                  if d.body is not None).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        replayed.record([d.key for d in ready], final)
        os.rename(part, os.path.join(self.path, final))
        dir_fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return (f"replayed {len(ready)} to {os.path.join(self.path, final)} (the spool reads "
                f"it like any other file){skipped}{note}")
