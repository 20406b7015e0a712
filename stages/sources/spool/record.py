"""The ack ledger's files: reading a record back (cutting off a torn write), appending to
it durably, and fingerprinting the spool file it belongs to.  The text itself is
:mod:`.ledger`'s.

Settled lines are appended to the record and fsync'd once per ``ack``/``fail`` call and
file: once per frame of acks, not per line.
"""

from __future__ import annotations

import logging
import os
import zlib

from . import ledger
from .files import fsync_dir, write_all

log = logging.getLogger("offbroadway.sources.spool")

RECORD_SUFFIX = ".acked"
#: bytes fingerprinted to tell a file from another of the same name
HEAD_BYTES = 4096


def fingerprint(path: str, like: str | None = None) -> str:
    """``"<crc32>:<length>"`` of the file's first bytes: as many as ``like`` covered, else up
    to :data:`HEAD_BYTES`.  Appending to a file keeps its fingerprint; replacing it does
    not."""
    length = int(like.partition(":")[2] or 0) if like else HEAD_BYTES
    with open(path, "rb") as f:
        head = f.read(length)
    return f"{zlib.crc32(head)}:{len(head)}"


def load(path: str) -> ledger.Record:
    """The record at ``path`` (an empty one if there is none).  A torn last line is cut off
    the file, so the next append starts on a fresh line."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return ledger.Record()
    record = ledger.parse(raw)
    if record.whole < len(raw):
        log.warning("spool: %s ends in a torn write; cutting %d bytes", path,
                    len(raw) - record.whole)
        os.truncate(path, record.whole)
    for token in record.unreadable:
        log.warning("spool: %s: ignoring unreadable entry %r", path, token)
    return record


def append(fd: int | None, path: str, head: str, text: str) -> int:
    """Append ``text`` to the record at ``path`` and make it durable; returns the open fd
    (``fd`` if one was open).  A new record starts with its header, and its name is made
    durable too (the directory is fsync'd).  An append the disk refuses (full) is cut
    back off the file before the error is raised: the record never holds half a line
    that a later append would run into."""
    opened = fd is None
    if fd is None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        start = os.fstat(fd).st_size
        data = (ledger.header(head) + text) if start == 0 else text
        try:
            write_all(fd, data.encode())
            os.fdatasync(fd)
        except OSError:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass
            raise
        if start == 0:
            fsync_dir(os.path.dirname(path))   # the new name must survive a crash too
        return fd
    except OSError:
        if opened:
            os.close(fd)
        raise
