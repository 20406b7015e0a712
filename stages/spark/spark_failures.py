"""What a failed Spark call means, with no pyspark: the outcomes a writer hands its owner
(:class:`CommitFailed`, :class:`WriteAbandoned`), the sink's own (:class:`Permanent`,
:class:`CallTimeout`), and a failure's reason on one line.

The committer's pure core (:mod:`..roles.committer_jobs`) decides on these without
importing pyspark; the sink (:mod:`.spark_sink`, :mod:`.spark_session`) raises them.
"""

from __future__ import annotations

import re

__all__ = ["CallTimeout", "CommitFailed", "Permanent", "WriteAbandoned", "missing",
           "one_line", "root_cause", "session_gone"]


class WriteAbandoned(Exception):
    """The owner is stopping (``should_stop()``) while a write was backing off between
    attempts: the batch is neither committed nor failed, so its messages must stay unacked
    and be delivered again.  Without this, a batch processor told to stop while Spark is
    down kept retrying until SIGKILL at its shutdown deadline: after a crash of the local
    Spark server that held the whole rest_for_one restart up for max(10 s,
    shutdown_timeout) per batch processor, and every retry went to the dead incarnation's
    port and token, so it could never succeed (found by bench/chaos.py)."""


class CommitFailed(Exception):
    """A Spark job did not commit.  ``permanent``: retrying the same rows cannot help
    (Spark rejected the plan or data); else the retry bound ran out."""

    def __init__(self, reason: str, *, permanent: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.permanent = permanent


class Permanent(Exception):
    """A failure that no retry can fix.  ``sticky``: every later batch would fail the same
    way (a bad DDL, a partition column outside the declared schema), so they fail at once
    without asking the server again."""

    def __init__(self, reason: str, *, sticky: bool = False) -> None:
        super().__init__(reason)
        self.sticky = sticky


class CallTimeout(Exception):
    """A Spark call ran past ``write_timeout``; it was abandoned (its channel closed)."""


_GRPC_FIELD = re.compile(r'^\s*(status|details)\s*=\s*"?(.*?)"?\s*$')


def one_line(exc: BaseException, limit: int = 300) -> str:
    """A reason fit for a message status and one log line.

    A raw gRPC error prints as ``<_InactiveRpcError of RPC that terminated with:`` and the
    useful part on later lines: keep its status code and details instead.
    """
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else ""
    if first.startswith("<_") and "RPC" in first:
        found = dict(m.groups() for m in map(_GRPC_FIELD.match, lines[1:]) if m)
        if found:
            status = found.get("status", "").removeprefix("StatusCode.")
            first = f"{status}: {found.get('details', '')}".strip(": ")
    cause = root_cause(exc)
    if cause and cause not in first:
        cause = cause[:limit // 2]
        return f"{type(exc).__name__}: {first}"[:limit - len(cause) - 3] + f" ({cause})"
    return f"{type(exc).__name__}: {first}"[:limit]


def root_cause(exc: BaseException) -> str | None:
    """The deepest cause of a Spark error, from the server's stack trace: Spark says
    "task failed while writing rows", the file system says why (``java.io.IOException:
    No space left on device``), and only the latter tells an operator what to do."""
    get = getattr(exc, "getStackTrace", None)
    trace = get() if callable(get) else None
    if not trace:
        return None
    causes = [line.removeprefix("Caused by: ").strip() for line in trace.splitlines()
              if line.startswith("Caused by: ")]
    return causes[-1] if causes else None


def missing(exc: BaseException) -> bool:
    """Spark says the dataset (or table) does not exist yet, or holds no data file (a
    first job killed before any task committed leaves only its ``_temporary``)."""
    text = str(exc)
    return any(code in text for code in ("PATH_NOT_FOUND", "TABLE_OR_VIEW_NOT_FOUND",
                                         "UNABLE_TO_INFER_SCHEMA"))


def session_gone(exc: BaseException) -> bool:
    """The server does not know the session (any more): nothing of it can run."""
    text = str(exc)
    return "SESSION_NOT_FOUND" in text or "SESSION_CLOSED" in text
