"""An example of your own source: a SQLite table used as a work queue.

``[producer] source = "examples.sqlite_source:SQLiteQueueSource"`` with
``[producer.options] path = "jobs.db"``.  Something (a web app, a cron job) inserts rows
``(body)`` into the table; the pipeline handles each row and deletes it once it is done;
failed rows move to ``<table>_dead`` with the reason.  Standard library only.

It shows what the Source API asks of a source (``docs/sources.md``, "Your own source"):

* the constructor only validates and stores options, so ``offbroadway check`` can build it;
* ``open`` acquires the connection, and hands back whatever this producer had leased when
  its previous incarnation died (a SIGKILLed producer never got to ``requeue`` it);
* ``fetch(n)`` returns at most ``n`` rows and leases them in the same transaction, so no row
  is handed out twice;
* ``ack`` forgets rows durably (one transaction per call: the producer calls it once per
  burst of acks), ``fail`` moves them to the dead-letter table, ``requeue`` releases them;
* ``exhausted`` is true only when no unleased row of this producer's share is left;
* producers split the table by ``id % producer_count``, so two never fetch the same row.

One daemon per database file: leases are per producer index, not per daemon.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from collections.abc import Mapping
from typing import Any

from offbroadway.stages.sources.base import (
    Failure,
    Item,
    Source,
    SourceOptionError,
    option_float,
    option_str,
)

_TABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_CHUNK = 500     # ids per statement (SQLite's parameter limit is 999 on old builds)


class SQLiteQueueSource(Source):
    """Rows of ``table`` (``id INTEGER PRIMARY KEY, body TEXT``) as messages.

    ``message.data`` is the body parsed as JSON (the text itself if it is not JSON);
    ``message.id`` is ``<table>:<id>``; ``metadata`` has ``row`` (the id).
    """

    name = "sqlite_queue"
    known_options = frozenset({"path", "table", "poll_interval"})

    def __init__(self, options: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(options, **kwargs)
        self.path = os.path.abspath(str(self.options["path"]))
        self.table = self.options.get("table", "jobs")
        self.poll_interval = option_float(self.name, self.options, "poll_interval", 0.2,
                                          minimum=0.001)
        self._db: sqlite3.Connection | None = None
        self._leased: set[int] = set()
        self.fetched = self.acked = self.failed = self.requeued = self.released = 0

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        super().validate_options(options)        # unknown option names
        option_str(cls.name, options, "path", None, required=True)
        table = option_str(cls.name, options, "table", "jobs")
        if not _TABLE.match(table or ""):
            raise SourceOptionError(f"{cls.name} source: option 'table' must be a plain SQL "
                                    f"identifier, got {table!r}", "table")
        option_float(cls.name, options, "poll_interval", 0.2, minimum=0.001)

    @classmethod
    def preflight(cls, options: Mapping[str, Any]) -> list[str]:
        folder = os.path.dirname(os.path.abspath(str(options["path"])))
        if not os.path.isdir(folder):
            raise SourceOptionError(f"{cls.name} source: option 'path': directory {folder!r} "
                                    f"does not exist", "path")
        return []

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self) -> None:
        db = sqlite3.connect(self.path, isolation_level=None, timeout=30.0)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")   # WAL + NORMAL: durable across a crash
        t = self.table
        db.execute(f"CREATE TABLE IF NOT EXISTS {t} (id INTEGER PRIMARY KEY, body TEXT NOT "
                   f"NULL, leased INTEGER NOT NULL DEFAULT 0)")
        db.execute(f"CREATE TABLE IF NOT EXISTS {t}_dead (id INTEGER PRIMARY KEY, body TEXT, "
                   f"reason TEXT, failed_at REAL)")
        # what an earlier incarnation of this producer leased and never settled is ours again
        cur = db.execute(f"UPDATE {t} SET leased = 0 WHERE leased = 1 AND id % ? = ?",
                         (self.producer_count, self.producer_index))
        self.released = cur.rowcount
        self._db = db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    # -- the message flow ----------------------------------------------------------------------
    def fetch(self, n: int) -> list[Item]:
        if n <= 0 or self._db is None:
            return []
        with self._transaction() as db:
            rows = db.execute(
                f"SELECT id, body FROM {self.table} WHERE leased = 0 AND id % ? = ? "
                f"ORDER BY id LIMIT ?", (self.producer_count, self.producer_index, n)).fetchall()
            _where_id_in(db, f"UPDATE {self.table} SET leased = 1", [r[0] for r in rows])
        self._leased.update(r[0] for r in rows)
        self.fetched += len(rows)
        return [(f"{self.table}:{row_id}", _parse(body), {"row": row_id}, row_id)
                for row_id, body in rows]

    def ack(self, handles: list[Any]) -> None:
        with self._transaction() as db:
            _where_id_in(db, f"DELETE FROM {self.table}", handles)
        self._leased.difference_update(handles)
        self.acked += len(handles)

    def fail(self, failures: list[Failure]) -> None:
        now = time.time()
        with self._transaction() as db:
            for row_id, reason in failures:
                db.execute(f"INSERT OR REPLACE INTO {self.table}_dead (id, body, reason, "
                           f"failed_at) SELECT id, body, ?, ? FROM {self.table} WHERE id = ?",
                           (str(reason), now, row_id))
                db.execute(f"DELETE FROM {self.table} WHERE id = ?", (row_id,))
        self._leased.difference_update(h for h, _ in failures)
        self.failed += len(failures)

    def requeue(self, handles: list[Any]) -> None:
        with self._transaction() as db:
            _where_id_in(db, f"UPDATE {self.table} SET leased = 0", handles)
        self._leased.difference_update(handles)
        self.requeued += len(handles)

    def exhausted(self) -> bool:
        if self._db is None:
            return False
        row = self._db.execute(f"SELECT 1 FROM {self.table} WHERE leased = 0 AND id % ? = ? "
                               f"LIMIT 1", (self.producer_count, self.producer_index)).fetchone()
        return row is None

    def retry_after(self) -> float:
        return self.poll_interval

    def stats(self) -> dict[str, Any]:
        return {"source": self.name, "path": self.path, "table": self.table,
                "fetched": self.fetched, "acked": self.acked, "failed": self.failed,
                "requeued": self.requeued, "released_at_open": self.released,
                "unacked": len(self._leased)}

    # -- helpers -------------------------------------------------------------------------------
    def _transaction(self) -> _Transaction:
        assert self._db is not None, "the source is not open"
        return _Transaction(self._db)


class _Transaction:
    """``BEGIN IMMEDIATE`` … ``COMMIT`` (``ROLLBACK`` on error): writers queue up instead of
    failing halfway, and a crash in between leaves nothing half-done."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")


def _where_id_in(db: sqlite3.Connection, statement: str, ids: list[int]) -> None:
    """``statement WHERE id IN (...)`` for every id, in chunks of ``_CHUNK`` (SQLite limits
    the parameters of one statement)."""
    for i in range(0, len(ids), _CHUNK):
        chunk = ids[i:i + _CHUNK]
        db.execute(f"{statement} WHERE id IN ({','.join('?' * len(chunk))})", chunk)


def _parse(body: str) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return body
