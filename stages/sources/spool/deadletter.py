"""The spool's failure policy: dead letters, appended durably to one file.

A failed line goes to ``<state_dir>/spool/dead-letter.jsonl`` (fsync'd) before it is
recorded as settled, so a crash in between can only write it there twice, never lose it.
Each entry is one JSON line: the file, line number, reason and text (a line over
``max_message_bytes`` is not copied: its size and offset say where it stays, in
``done_dir``), and which pipeline and producer failed it, when.
"""

from __future__ import annotations

import json
import os

from .files import write_all

DEAD_LETTER = "dead-letter.jsonl"


class DeadLetters:
    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, DEAD_LETTER)
        self._fd: int | None = None

    def write(self, entries: list[dict]) -> None:
        """Append ``entries`` durably, in one ``write()`` of whole lines: appends from
        several producers do not interleave.  A write the disk refuses is cut back off
        the file and raised."""
        if not entries:
            return
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        text = "\n".join(json.dumps(e, ensure_ascii=False) for e in entries) + "\n"
        start = os.fstat(self._fd).st_size
        try:
            write_all(self._fd, text.encode())
            os.fdatasync(self._fd)
        except OSError:   # a full disk: cut back what was written, so no torn entry stays
            try:
                os.ftruncate(self._fd, start)
            except OSError:
                pass
            raise

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
