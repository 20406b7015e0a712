"""Poison messages, the daemon's side: what a dead processor was running, and when the
producers may run suspects again.

A processor keeps its blame record in a file that outlives it
(:mod:`offbroadway.stages.poison.blame`); :func:`read_blame` takes it at the processor's
exit.  :class:`Quarantine` (pure) turns the records of a crash cascade into what the
producers' single requeue carries
(:class:`~offbroadway.stages.wire.commands.Blame`, and whether to quarantine suspects),
and says when the last of the restarting processors is back, so the producers are released.
The producers' side is :mod:`offbroadway.stages.poison.guard`.
"""

from __future__ import annotations

import logging

from offbroadway.stages.poison import blame as blame_mod
from offbroadway.stages.wire.commands import Blame
from offbroadway.supervision import ChildExited

log = logging.getLogger("offbroadway.daemon")


def read_blame(runtime_dir: str, event: ChildExited) -> Blame | None:
    """What a processor that died on its own was running (its blame record), said in one
    line.

    Only an unexpected exit blames anyone: a processor its supervisor stopped (a sibling's
    crash under one_for_all, a drain) died of nothing it was running.  The record is read
    and removed at every exit, before any restart, so a later incarnation that dies before
    writing its own cannot blame the same message twice.
    """
    record = blame_mod.take(blame_mod.path(runtime_dir, event.child_id))
    if event.expected or record is None or not record.suspects:
        return None
    if record.kind == "handle_message":
        log.warning("%s %s while running message %s", event.child_id, event.reason,
                    record.suspects[0].id)
    else:
        log.warning("%s %s in %s of a frame of %d messages", event.child_id, event.reason,
                    record.kind, record.frame_size)
    return record


def crash_blames(child_id: str, how: str, record: Blame | None) -> dict[int, Blame]:
    """A dead processor's blame record, per producer index, as each producer's requeue
    carries it: said of ``child_id`` that ended ``how``, with that producer's suspects."""
    if record is None:
        return {}
    crash = record.crashed(child_id, how)
    return {i: crash.of(i) for i in dict.fromkeys(s.producer for s in record.suspects)}


class Quarantine:
    """The poison state of one crash cascade, from the crash to the processors' return.

    ``blamed``: the stages whose death is blamed on what they ran (the processors).
    """

    def __init__(self, max_crashes: int, blamed: set[str]) -> None:
        self.max_crashes = max_crashes
        self.blamed = blamed
        #: producer index -> the blame its next requeue carries
        self.blames: dict[int, Blame] = {}
        #: the next requeue quarantines suspects (a processor died on its own)
        self.pending = False
        #: blamed stages of the cascade not up again yet: suspects wait until then
        self.awaiting: set[str] = set()

    def crashed(self, child_id: str, how: str, record: Blame | None) -> None:
        """A blamed stage died on its own (``how``), running ``record``."""
        if not self.max_crashes:
            return
        # one_for_all with max_restarts 0: every processor is about to restart
        self.pending = True
        for index, blame in crash_blames(child_id, how, record).items():
            # a second processor dying on its own in the same cascade (rare): the producer
            # takes one blame per requeue, the first; the other message is requeued unstruck
            self.blames.setdefault(index, blame)

    def requeue(self, alive: set[str]) -> tuple[dict[int, Blame], bool, bool]:
        """The cascade is down and its requeue goes out: (blames per producer index,
        quarantine, release at once: no blamed stage is restarting after all).  The state
        is spent."""
        blames, quarantine, release = self.blames, self.pending, False
        if quarantine:
            # set now, not at the crash: a processor still starting when its neighbour
            # crashed reports started before it is stopped, and must not count as back
            self.awaiting = self.blamed - alive
            release = not self.awaiting
        self.blames, self.pending = {}, False
        return blames, quarantine, release

    def started(self, child_id: str) -> bool:
        """A worker is up; True when it is the last blamed stage the producers waited for."""
        if child_id not in self.awaiting:
            return False
        self.awaiting.discard(child_id)
        return not self.awaiting
