"""A producer's poison books on disk: what its crashes taught outlives the process.

The strikes live in the producer (:mod:`.guard`), but a producer is restarted within one
daemon run (a crash during an ``--until-idle`` drain runs the pipeline again with new
producers; a producer's own crash), and a count that starts from zero each time never
reaches ``max_crashes`` for a message that crashes once per incarnation.  So the producer
writes its books to ``<runtime_dir>/<producer>.strikes`` whenever they change (at a crash
and when a suspect settles: rare, never per message) and its successor reads them before
it fetches anything.  The daemon removes the files when it starts (:func:`clear`): books
are per daemon run, as before (a spool's ids repeat across runs of files of the same name).

The file is JSON (ids are strings; nothing in it is code), written whole to a temporary
name and renamed, mode 0600, so a producer killed mid-write leaves the previous books.
No books: no file.  A file that does not read is no books (the producer logs it and runs
on), never a producer that cannot start.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os

log = logging.getLogger("offbroadway.producer")

SUFFIX = ".strikes"


def path(runtime_dir: str, stage_id: str) -> str:
    return os.path.join(runtime_dir, f"{stage_id}{SUFFIX}")


def save(file_path: str, books: dict) -> None:
    """Write ``books`` (:meth:`.guard.PoisonGuard.books`); none at all removes the file."""
    try:
        if not books.get("strikes") and not books.get("isolate"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(file_path)
            return
        tmp = f"{file_path}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        # O_EXCL | O_NOFOLLOW: a symlink planted in the runtime dir must not redirect it
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(books, f, separators=(",", ":"))
        os.replace(tmp, file_path)
    except (OSError, TypeError, ValueError) as exc:
        log.warning("poison books %s not written (%s): a restart of this producer would "
                    "count crashes from zero", file_path, exc)


def load(file_path: str) -> dict:
    """The books a previous incarnation wrote ({} if none or unreadable)."""
    try:
        fd = os.open(file_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        log.warning("poison books %s not read (%s)", file_path, exc)
        return {}
    try:
        with os.fdopen(fd, encoding="utf-8") as f:
            books = json.load(f)
    except (OSError, ValueError) as exc:
        log.warning("poison books %s not read (%s)", file_path, exc)
        return {}
    return books if isinstance(books, dict) else {}


def clear(runtime_dir: str) -> None:
    """A daemon starts: the books of an earlier run are not this run's (nor a ``.tmp``
    a kill left)."""
    for name in glob.glob(os.path.join(glob.escape(runtime_dir), f"*{SUFFIX}*")):
        with contextlib.suppress(OSError):
            os.unlink(name)
