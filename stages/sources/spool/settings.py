"""The ``spool`` source's options, validated (pure: what ``offbroadway check`` uses).

``path`` (required), ``pattern`` (default ``"*.jsonl"``), ``done_dir`` (default
``<path>/done``; relative to ``path``), ``scan_interval`` (seconds between directory
rescans when idle, default 1.0), ``max_message_bytes``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..base import (
    SourceOptionError,
    option_float,
    option_max_message_bytes,
    option_str,
)

NAME = "spool"
KNOWN_OPTIONS = frozenset({"path", "pattern", "done_dir", "scan_interval",
                           "max_message_bytes"})


@dataclass(frozen=True)
class SpoolSettings:
    path: str
    pattern: str
    done_dir: str
    scan_interval: float
    max_message_bytes: int


def parse_options(options: Mapping[str, Any]) -> SpoolSettings:
    """Validate every option (each default written once, here), raising
    :class:`SourceOptionError` naming the key (unknown names are the base class's check).
    Paths are made absolute from the working directory, as the producer will."""
    path = os.path.abspath(option_str(NAME, options, "path", None, required=True) or "")
    pattern = option_str(NAME, options, "pattern", "*.jsonl") or "*.jsonl"
    if "/" in pattern:
        raise SourceOptionError(f"spool source: option 'pattern' matches file names in "
                                f"'path', so it cannot contain '/': {pattern!r}", "pattern")
    done = option_str(NAME, options, "done_dir", "done") or "done"
    done_dir = os.path.normpath(os.path.join(path, done))
    if done_dir == path:
        raise SourceOptionError("spool source: option 'done_dir' must not be 'path' "
                                "itself, or finished files would be read again", "done_dir")
    return SpoolSettings(path=path, pattern=pattern, done_dir=done_dir,
                         scan_interval=option_float(NAME, options, "scan_interval", 1.0),
                         max_message_bytes=option_max_message_bytes(NAME, options))
