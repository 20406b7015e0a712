"""Log lines for journald and log shippers: one line per event, tagged with the child id.

The daemon and every stage process configure logging through :func:`configure`, so a
pipeline's processes all speak one format: text (``2026-… INFO [processor_default_0]
logger: message``) or, with ``runtime.log_format = "json"``, one JSON object per line
with the same fields.  Everything goes to stderr, which systemd hands to the journal.
"""

from __future__ import annotations

import json
import logging
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
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def configure(level: str, fmt: str, child: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(child))
    else:
        handler.setFormatter(logging.Formatter(
            f"%(asctime)s %(levelname)s [{child}] %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
