"""Where a source keeps its dead letters, as ``offbroadway dead-letters`` reads and replays
them: one small interface, one implementation per source (next to the source that wrote
them, since only it knows the format).

A source's :meth:`~.base.Source.dead_letters` returns a :class:`DeadLetterBox` (or None:
the generator keeps none).  The box lists the letters (:meth:`DeadLetterBox.letters`) and
puts chosen ones back where the source reads (:meth:`DeadLetterBox.replay`), so they run
again through the pipeline once the handler is fixed.  The command decides which (a
reason, not replayed before) and keeps the record of what was replayed
(:class:`Replayed`, in ``offbroadway.daemon.deadletters``); each box says in its replay
how it keeps a crash in the middle from replaying a letter twice or losing it.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol


class DeadLetterError(RuntimeError):
    """One line for the operator: nowhere to read from, a broker that does not answer…"""


@dataclass(frozen=True)
class DeadLetter:
    """One failed message as its source kept it."""

    #: stable identity: the same letter listed twice has the same key (the replay record's)
    key: str
    reason: str
    #: epoch seconds it was dead-lettered, if the source recorded it
    failed_at: float | None
    #: where it came from, in the source's terms ("orders.jsonl:12", "queue orders")
    origin: str
    #: what ``show`` prints: the line or body as text (None: not kept, cannot be replayed)
    body: str | None
    #: the box's own handle on it (a delivery, an entry id), opaque to the command
    handle: Any = None


class Replayed(Protocol):
    """The command's record of replayed letters (``offbroadway.daemon.deadletters``)."""

    def record(self, keys: Iterable[str], to: str) -> None:
        """Durably note that ``keys`` were put back, into ``to``."""

    def targets(self) -> set[str]:
        """Every ``to`` recorded (a box finishing a replay a crash interrupted asks)."""


class DeadLetterBox(abc.ABC):
    """A source's dead letters: listed, and replayed back to the source."""

    #: where they are, for the operator ("/var/lib/…/dead-letter.jsonl", "queue orders.dead")
    where: str = ""
    #: True when a replayed letter stays where it is (an append-only file): the command
    #: then skips the letters its record holds.  A broker's box moves a letter out of the
    #: dead-letter queue as it replays it, so what is there was not replayed (a letter
    #: that failed again after its replay is there again, and may be replayed again)
    keeps_replayed: bool = False

    @abc.abstractmethod
    def letters(self) -> list[DeadLetter]:
        """Every dead letter there, oldest first; listing leaves them in place."""

    @abc.abstractmethod
    def replay(self, letters: list[DeadLetter], replayed: Replayed) -> str:
        """Put ``letters`` back where the source reads them and record them in
        ``replayed``; return one line saying what was done."""

    def close(self) -> None:
        """Release connections."""

    def __enter__(self) -> DeadLetterBox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
