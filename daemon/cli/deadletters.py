"""``offbroadway dead-letters CONFIG [list | show | replay]``: the failed messages a
pipeline's source kept, listed, shown and put back to run again once the handler is fixed.

Each source keeps its own (a file for the spool, a dead-letter queue for RabbitMQ, a
stream for Redis, a subject for NATS) and knows how to read and replay them: the source
class's :meth:`~offbroadway.stages.sources.base.Source.dead_letters` box
(:mod:`offbroadway.stages.sources.deadletters`).  This module is the command around the
boxes: it picks the letters (by reason, not replayed before), says what there is, and
keeps :class:`ReplayRecord`, the durable record of what was replayed where, so a second
replay does not replay the same letters again.  It needs the config only (the source's
options and the state dir), not a running daemon: a replay goes to the source, and a
running pipeline takes it from there like any other message.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from offbroadway.stages.sources import get_source
from offbroadway.stages.sources.deadletters import DeadLetter, DeadLetterBox, DeadLetterError

from ..config.records import Config

RECORD = "dead-letters-replayed.jsonl"
#: characters of a letter's body ``show`` prints
SHOW_CHARS = 300


#: one line for the operator: no dead letters kept, a broker that does not answer…
DeadLettersError = DeadLetterError


class ReplayRecord:
    """``<state_dir>/dead-letters-replayed.jsonl``: one JSON line per replayed letter (its
    key, where it went, when), fsync'd before the letter is made visible at the source.
    Held under an exclusive lock while a replay runs, so two replays never interleave."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, RECORD)
        self._keys: set[str] = set()
        self._targets: set[str] = set()
        self._fd: int | None = None
        self._load()

    def _load(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as f:
                for line in f:
                    try:
                        entry = json.loads(line)
                    except ValueError:
                        continue          # cut by a crash before its fsync: not recorded
                    self._keys.add(entry["key"])
                    self._targets.add(entry["to"])
        except FileNotFoundError:
            pass

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def lock(self) -> None:
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.close()
            raise DeadLettersError(f"another replay is running (it holds {self.path})") \
                from None
        self._load()            # what a replay recorded before we had the lock

    def record(self, keys: Iterable[str], to: str) -> None:
        assert self._fd is not None, "lock() first"
        now = time.time()
        text = "".join(json.dumps({"key": k, "to": to, "at": now}) + "\n" for k in keys)
        os.write(self._fd, text.encode())
        os.fsync(self._fd)
        self._keys.update(keys)
        self._targets.add(to)

    def targets(self) -> set[str]:
        return set(self._targets)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def open_box(config: Config) -> DeadLetterBox:
    """The pipeline's source's dead letters, or :class:`DeadLettersError` saying why none."""
    source = config.producer.source
    box = get_source(source).dead_letters(config.producer.options,
                                          pipeline=config.pipeline.name,
                                          state_dir=config.runtime.state_dir)
    if box is None:
        raise DeadLettersError(f"the {source} source keeps no dead letters (its failed "
                               f"messages are counted and dropped)")
    return box


@dataclass
class Selection:
    """The letters a command works on: to replay, and how many were replayed before."""

    letters: list[DeadLetter]
    replayed_before: int


def select(box: DeadLetterBox, record: ReplayRecord, reason: str | None) -> Selection:
    letters = box.letters()
    before = 0
    if box.keeps_replayed:
        fresh = [d for d in letters if d.key not in record]
        before = len(letters) - len(fresh)
        letters = fresh
    if reason is not None:
        letters = [d for d in letters if reason in d.reason]
    return Selection(letters, before)


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "unknown"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


def describe(config: Config, box: DeadLetterBox, sel: Selection, reason: str | None,
             record: ReplayRecord) -> list[str]:
    """``list``: how many, where, oldest and newest, reasons grouped (most first)."""
    what = f" whose reason contains {reason!r}" if reason else ""
    head = (f"pipeline {config.pipeline.name}: {len(sel.letters)} dead letters{what} in "
            f"{box.where}")
    if box.keeps_replayed and sel.replayed_before:
        head += f" ({sel.replayed_before} more replayed before)"
    lines = [head]
    if record.path and len(record):
        lines.append(f"replays are recorded in {record.path}")
    if not sel.letters:
        return lines
    times = [d.failed_at for d in sel.letters if d.failed_at is not None]
    if times:
        lines.append(f"oldest {_when(min(times))}, newest {_when(max(times))}")
    lines.append("reasons:")
    for why, n in Counter(d.reason for d in sel.letters).most_common():
        lines.append(f"  {n:>7}  {why or '(none recorded)'}")
    return lines


def show(sel: Selection, limit: int) -> list[str]:
    """``show``: the first ``limit`` letters, each with where it came from, when, why, and
    its body (cut to :data:`SHOW_CHARS`)."""
    lines = []
    for d in sel.letters[:limit]:
        lines.append(f"{_when(d.failed_at)}  {d.origin}  reason: {d.reason or '(none)'}")
        body = "(not kept: too large)" if d.body is None else d.body
        if len(body) > SHOW_CHARS:
            body = body[:SHOW_CHARS] + f"… ({len(d.body or '')} characters)"
        lines.append(f"    {body}")
    if len(sel.letters) > limit:
        lines.append(f"… and {len(sel.letters) - limit} more (--limit N)")
    return lines


def replay(box: DeadLetterBox, record: ReplayRecord, reason: str | None) -> list[str]:
    """``replay``: the letters not replayed before (and matching ``reason``) go back to the
    source; says what was done."""
    record.lock()
    try:
        sel = select(box, record, reason)
        what = f" whose reason contains {reason!r}" if reason else ""
        if not sel.letters:
            before = f" ({sel.replayed_before} replayed before)" if box.keeps_replayed else ""
            return [f"nothing to replay: no dead letters{what} in {box.where}{before}"]
        line = box.replay(sel.letters, record)
        return [f"{len(sel.letters)} dead letters{what}: {line}",
                f"recorded in {record.path}"]
    finally:
        record.close()
