"""Writing each message once: the committer's commit journal and its set of ids in doubt.

Why (docs/design-spark.md §5): a message is acknowledged only after the Spark job holding
it committed, so a crash can leave rows committed but not acknowledged; their source
delivers them again, and without this they would be written twice.  Which messages can
that be?  Only those of the last jobs before the crash:

* each commit has an identity, its ``ingested_at`` stamp (unique per committer, written
  with every row of the commit, so it lives where Spark writes, also on a cluster);
* before a job starts, the committer appends its stamp to a small **journal** in the
  daemon's state dir (fsync'd; the last :data:`KEEP` stamps kept, so it stays bounded);
* a new committer incarnation reads the journal's last :data:`RECOVER` stamps and asks
  Spark for the ``message_id``s of the rows with those stamps: the **ids in doubt**;
  unless the journal ends with :data:`CLEAN`, which the daemon writes after a run whose
  every message was acknowledged at its source and every committed row answered (no
  message of those commits can come back, so none is in doubt);
* a batch processor that restarts while the committer lives leaves the ids of its
  recently committed batches in doubt (the committer keeps their staged files, the last
  :data:`PEER_BATCHES` per batch processor, and reads the ids only then);
* a stage's death hands *every* message in flight back to its source (the producers'
  in-flight table), while stale copies of some are still on their way to the committer
  through the stages that live on; so after any restart (a batch processor's new
  incarnation says hello, or the committer itself starts with a journal) the committer
  **watches**: for the next :data:`WATCH` × ``max_rows`` committed rows, every id it
  commits is in doubt too, and whichever copy of a message comes first is the one
  written;
* every staged batch is checked against the ids in doubt (``pc.is_in`` over the whole
  group's ids at once, in C, only while any are in doubt or a watch runs): rows already
  committed are dropped from the file before Spark reads it, and their messages are
  acknowledged as written;
* while it checks, the committer also keeps one row per id *within* the group
  (:func:`repeats`, in C): after a requeue a stale copy and the redelivered copy of a
  message can reach it close together, in one Broadway batch or in two batches of one
  group, and neither is in the dataset yet when the group is checked.

The set is forgotten :data:`HORIZON` seconds after it last grew once the watch is over
(the source redelivers at once; anything later is a new delivery).

No pyspark here: the Spark query is the sink's (:meth:`.spark_sink.SparkSink.ids_of`).
"""

from __future__ import annotations

import os
import time
from collections import deque
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Doubt", "Journal", "RecentFiles", "either", "repeats"]

#: stamps kept in the journal (rewritten to this many once it holds ten times more)
KEEP = 16
#: the jobs a crash can leave committed but not acknowledged: the one running and the
#: ones just before whose answers may not have reached their batch processors yet
RECOVER = 3
#: the journal's last line after a run that left nothing in doubt (:meth:`Journal.mark_clean`)
CLEAN = "clean"
#: committed batches remembered per batch processor, at least (its unacknowledged answers
#: are at most its ``max_demand`` batches, which the topology gives the committer as
#: ``peer_batches``: 201 for the README's config)
PEER_BATCHES = 128
#: seconds after which ids still in doubt are forgotten
HORIZON = 600.0
#: a watch lasts this many largest jobs' worth of rows: more than the pipeline holds in
#: flight (the batch processors' demand is sized to two jobs)
WATCH = 2


class Journal:
    """The stamps of the commits this committer started, newest last (a local file)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lines = 0

    def last(self, n: int = RECOVER) -> list[datetime]:
        try:
            lines = self.path.read_text().split()
        except FileNotFoundError:
            return []
        out: list[datetime] = []
        for line in reversed(lines):
            if len(out) == n:
                break
            try:
                out.append(datetime.fromisoformat(line))
            except ValueError:   # a torn line (killed mid-write): that job never started
                continue
        return out[::-1]

    def ended_clean(self) -> bool:
        """Whether the last run ended with every committed row acknowledged at its source
        (:meth:`mark_clean` after the last commit): then nothing of it is in doubt."""
        try:
            lines = self.path.read_text().split()
        except FileNotFoundError:
            return False
        return bool(lines) and lines[-1] == CLEAN

    def mark_clean(self) -> None:
        """Durably: every commit recorded so far was acknowledged at its source, so the
        next incarnation has nothing in doubt.  A commit recorded after it comes after it
        in the file, and the mark no longer ends the journal."""
        if not self.path.exists():
            return
        _append(self.path, CLEAN)

    def record(self, stamp: datetime) -> None:
        """Durably, before the job starts: a crash after this line leaves the commit in
        doubt, never unknown."""
        if self._lines >= 10 * KEEP:
            self._compact()
        _append(self.path, stamp.isoformat())
        self._lines += 1

    # -- the server-side sessions of this committer's incarnations ----------------------
    @property
    def _sessions_path(self) -> Path:
        return self.path.with_name(self.path.name + ".sessions")

    def sessions(self) -> list[str]:
        """The Spark Connect session ids of incarnations not known to be over on the
        server (oldest first): a new incarnation waits until none of their jobs runs."""
        try:
            return [s for s in self._sessions_path.read_text().split() if s]
        except FileNotFoundError:
            return []

    def add_session(self, session_id: str) -> None:
        """Durably, before the session's first call: a crash after this line leaves the
        session findable by the next incarnation."""
        _append(self._sessions_path, session_id)

    def settled(self, settled: list[str]) -> None:
        """The sessions ``settled`` are over on the server: forgotten (so the file holds
        the running incarnation's, plus those of incarnations that died before settling)."""
        gone = set(settled)
        _replace(self._sessions_path, [s for s in self.sessions() if s not in gone])

    def _compact(self) -> None:
        keep = [s.isoformat() for s in self.last(KEEP)]
        _replace(self.path, keep)
        self._lines = len(keep)


def _replace(path: Path, lines: list[str]) -> None:
    """``path`` holds ``lines`` and nothing else, durably and whole: written beside it,
    fsync'd, then renamed over it (a crash leaves the old file or the new, never half)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{line}\n" for line in lines))
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _append(path: Path, line: str) -> None:
    """One line, durably (fsync'd) and on its own: a leading newline ends a line torn by
    a crash (blank lines are skipped when read)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, f"\n{line}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class Doubt:
    """Message ids that may already be in the dataset (see the module docstring), and,
    while a restart's stale copies may still flow, every id committed since."""

    def __init__(self, horizon: float = HORIZON) -> None:
        self.horizon = horizon
        self._ids: pa.Array | None = None
        self._until = 0.0
        self._watch_left = 0
        self.skipped = 0

    def __len__(self) -> int:
        return 0 if self._ids is None else len(self._ids)

    @property
    def watching(self) -> bool:
        return self._watch_left > 0

    def active(self, now: float | None = None) -> bool:
        """Whether batches must be checked now (ids in doubt, or a watch running)."""
        if self._watch_left <= 0 and self._ids is not None and \
                (time.monotonic() if now is None else now) > self._until:
            self._ids = None   # past the horizon: forgotten
        return self._ids is not None or self._watch_left > 0

    def add(self, ids: pa.Array | pa.ChunkedArray, now: float | None = None) -> None:
        ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
        if not len(ids):
            return
        ids = ids.cast(pa.string())
        self._ids = ids if self._ids is None else pa.concat_arrays([self._ids, ids])
        self._ids = pc.unique(self._ids)
        self._until = (time.monotonic() if now is None else now) + self.horizon

    def watch(self, rows: int) -> None:
        """A restart just handed every message in flight back to its source, while stale
        copies of some may still be on their way here: for the next ``rows`` committed
        rows, every committed id is in doubt too (whichever copy comes first is written,
        the other is not)."""
        self._watch_left = max(self._watch_left, rows)

    def committed(self, ids: pa.Array | pa.ChunkedArray) -> None:
        """The ids a job just committed: in doubt too while the watch lasts."""
        if self._watch_left > 0:
            self.add(ids)
            self._watch_left -= len(ids)

    def mask(self, ids: pa.Array) -> pa.Array | None:
        """True where an id is in doubt (None: none is)."""
        if self._ids is None or not len(ids):
            return None
        hit = pc.is_in(ids, value_set=self._ids)
        return hit if pc.any(hit).as_py() else None

    def check(self, ids: list[pa.Array]) -> tuple[list[pa.Array | None], set[int]]:
        """For the batches of one group (their ``message_id`` columns, in order): per
        batch, True at the rows to leave out (None: none), those in doubt and those
        whose id an earlier row of the group has; and the batches that lost a row as
        such a repeat (the copy kept is in another batch: they are written only if the
        group is).  One ``is_in`` and one ``unique`` over the whole group, in C."""
        whole = pa.concat_arrays(ids) if ids else pa.array([], pa.string())
        again = repeats(whole)
        hit = either(self.mask(whole), again)
        masks: list[pa.Array | None] = []
        follows: set[int] = set()
        at = 0
        for i, batch in enumerate(ids):
            if hit is None:
                masks.append(None)
                continue
            part = hit.slice(at, len(batch))
            if again is not None and pc.any(again.slice(at, len(batch))).as_py():
                follows.add(i)
            masks.append(part if pc.any(part).as_py() else None)
            at += len(batch)
        return masks, follows

    def filter(self, table: pa.Table) -> pa.Table | None:
        """``table`` without the rows in doubt and the repeats of an earlier row (while
        ids are in doubt or a watch runs); None when no row goes."""
        if self._ids is None and self._watch_left <= 0:
            return None
        ids = table.column("message_id").combine_chunks()
        hit = either(self.mask(ids), repeats(ids))
        if hit is None:
            return None
        self.skipped += pc.sum(hit).as_py() or 0
        return table.filter(pc.invert(hit))


def either(a: pa.Array | None, b: pa.Array | None) -> pa.Array | None:
    """The union of two masks of which either may be None (no row)."""
    return b if a is None else a if b is None else pc.or_(a, b)


def repeats(ids: pa.Array) -> pa.Array | None:
    """True at each row whose id an earlier row of ``ids`` already has (None: every id is
    once).  In C: ``unique`` keeps ids in the order they first appear, so a row is the
    first of its id exactly when its index among them is above every index before it."""
    uniq = pc.unique(ids)
    if len(uniq) == len(ids):
        return None
    at = pc.index_in(ids, value_set=uniq)
    seen = pc.cumulative_max(at)
    before = pa.concat_arrays([pa.array([-1], at.type), seen.slice(0, len(seen) - 1)])
    return pc.less_equal(at, before)


class RecentFiles:
    """Per batch processor, the staged files of its last committed batches, kept on disk
    (no per-row cost while nothing fails): if it restarts, the ids in them are in doubt
    (its answers may not all have become acks)."""

    def __init__(self, batches: int = PEER_BATCHES) -> None:
        self.batches = batches
        self._by_peer: dict[bytes, deque[str]] = {}

    def add(self, peer: bytes, name: str) -> str | None:
        """Remember ``name``; returns the file that falls out of the window (to remove)."""
        q = self._by_peer.setdefault(peer, deque())
        q.append(name)
        return q.popleft() if len(q) > self.batches else None

    def pop(self, peer: bytes) -> list[str]:
        return list(self._by_peer.pop(peer, ()))

    def names(self) -> set[str]:
        return {n for q in self._by_peer.values() for n in q}
