"""Log lines for journald and log shippers: one line per event, tagged with the child id.

The daemon and every stage process configure logging through :func:`configure`, so a
pipeline's processes all speak one format: text (``2026-… INFO [processor_default_0]
logger: message``) or, with ``runtime.log_format = "json"``, one JSON object per line
with the same fields.  Everything goes to stderr, which systemd hands to the journal.

Under systemd (``$JOURNAL_STREAM`` names our stderr) each line starts with the syslog
priority, ``<4>`` for a warning, which journald strips and records as the entry's priority
(``journalctl -p warning`` finds it), and the text line carries no timestamp: journald
stamps every entry itself.  Children inherit both the stream and the variable.
"""

from __future__ import annotations

import json
import logging
import os
import sys

LEVEL_ENV = "OFFBROADWAY_LOG_LEVEL"
FORMAT_ENV = "OFFBROADWAY_LOG_FORMAT"


class JsonFormatter(logging.Formatter):
    def __init__(self, child: str) -> None:
        super().__init__()
        self.child = child

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": round(record.created, 6), "level": record.levelname.lower(),
               "child": self.child, "logger": record.name, "msg": record.getMessage()}
        if record.exc_info or record.exc_text:
            # exc_text when a filter made it (redact.RedactFilter masks secrets in it)
            out["exc"] = record.exc_text or self.formatException(record.exc_info)
        return json.dumps(out)


#: logging level → syslog priority (sd-daemon(3)'s ``<N>`` line prefixes)
PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4),
              (logging.INFO, 6))


def priority(levelno: int) -> int:
    for floor, prio in PRIORITIES:
        if levelno >= floor:
            return prio
    return 7


def journal_stream(stream=None) -> bool:
    """Whether ``stream`` (stderr) is the journal: ``$JOURNAL_STREAM`` is its ``dev:ino``.

    Comparing the inode, as systemd.exec(5) advises, keeps a redirected stderr (a file,
    a pipe to a test) on the plain format even when the variable was inherited.
    """
    dev, _, ino = os.environ.get("JOURNAL_STREAM", "").partition(":")
    if not (dev.isdigit() and ino.isdigit()):
        return False
    try:
        st = os.fstat((stream or sys.stderr).fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


def prefix(levelno: int) -> str:
    """``<N>`` for a line written to stderr outside logging (the CLI's own messages)."""
    return f"<{priority(levelno)}>" if journal_stream() else ""


class JournalFormatter(logging.Formatter):
    """Each line of a record (a traceback too) prefixed with the record's priority."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        tag = f"<{priority(record.levelno)}>"
        return "\n".join(tag + line for line in self.inner.format(record).splitlines())


def configure(level: str, fmt: str, child: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    journal = journal_stream()
    if fmt == "json":
        formatter: logging.Formatter = JsonFormatter(child)
    elif journal:
        formatter = logging.Formatter(f"%(levelname)s [{child}] %(name)s: %(message)s")
    else:
        formatter = logging.Formatter(
            f"%(asctime)s %(levelname)s [{child}] %(name)s: %(message)s")
    handler.setFormatter(JournalFormatter(formatter) if journal else formatter)
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
