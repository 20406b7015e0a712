"""Poison messages, the producer's side: crashes counted per message, suspects run alone.

A handler that kills its processor leaves no exception to catch; the processor's blame
record (:mod:`.blame`) names what it was running, and the daemon hands that to the
producer that emitted it with the requeue (:class:`~.commands.Blame`).  Everything the
producer then does about it is here, pure and synchronous (ARCHITECTURE §9):

* :class:`StrikeTable` counts crashes per message id (what survives a redelivery; a token
  is per delivery); ``max_crashes`` of them make the message *poison*.
* :class:`PoisonGuard` takes each blame (strike the message a ``handle_message`` died on,
  or mark every message of a ``prepare_messages`` frame that died to be *isolated*), and
  when suspects come back from the source emits a poison one already failed (so it takes
  the ordinary failure path: ``handle_failed``, then the source's dead-letter) and has the
  others sent alone in their frame, so the next crash names one message, never an
  innocent neighbour.  While the processors restart after a crash the suspects are
  *quarantined*: kept back until the daemon's ``release_suspects``, or a sibling about to
  be terminated would run them and its death would count for nothing.

The producer calls the guard at five fixed points and nowhere else, as a broker's
middleware is called around each step (Dramatiq's ``after_fetch``, ``before_process``…):
:meth:`~PoisonGuard.on_fetched` (new events), :meth:`~PoisonGuard.on_dispatch` (what goes
out, and how), :meth:`~PoisonGuard.on_settled` (acks), :meth:`~PoisonGuard.on_requeue`
(a crash handed everything back, with its blame) and :meth:`~PoisonGuard.on_release` (the
processors are back).  Each hook costs one test when no message is suspect, so the
producer calls them unconditionally and knows nothing of strikes, watches or quarantine.

Memory is bounded twice: an id is forgotten as soon as its message settles (acked or
failed), and past ``cap`` ids the oldest are dropped, so ids whose messages never come
back (expired at the broker, taken by another consumer) cannot grow the table.

What the crashes taught (strikes and isolated ids, :meth:`PoisonGuard.books`) must outlive
the producer process: under ``--until-idle`` a crash during the drain makes the daemon
restart the producers to run again, and a poison message in flight when a drain begins
(a producer is idle with messages in flight) crashes in every drain.  With the count
starting from zero in each new producer it never reached ``max_crashes``: run again after
run again, until the pipeline's restart intensity ended the daemon.  The producer keeps
the books in a file (:mod:`.books`), and its successor takes them back
(:meth:`PoisonGuard.restore`).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ..wire import protocol
from ..wire.commands import Blame

DEFAULT_CAP = 10_000

log = logging.getLogger("offbroadway.producer")


@dataclass
class Record:
    """One struck message: how many crashes are blamed on it, and the last of them (the
    :class:`~.commands.Blame` the daemon sent, whose processor and end the poison verdict
    names)."""

    crashes: int
    last: Blame


#: how the reason of a message failed as poison begins (a requeuing failure policy must not
#: requeue it: it would kill the processors again, forever)
POISON_REASON = "poison message: "


class StrikeTable:
    """message id → crashes blamed on it; ``limit`` crashes make a message poison.

    ``limit`` 0 turns the table off: nothing is recorded and nothing is ever poison.
    """

    def __init__(self, limit: int = 3, cap: int = DEFAULT_CAP) -> None:
        if limit < 0 or cap < 1:
            raise ValueError(f"limit must be >= 0 and cap >= 1 (got {limit}, {cap})")
        self.limit = limit
        self.cap = cap
        self._table: OrderedDict[str, Record] = OrderedDict()
        #: ids dropped because the table was full (an operator sees it in status)
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._table)

    def __bool__(self) -> bool:
        return bool(self._table)

    def __contains__(self, msg_id: object) -> bool:
        try:
            return msg_id in self._table
        except TypeError:
            return False

    def crashes(self, msg_id: str) -> int:
        rec = self._table.get(msg_id)
        return rec.crashes if rec is not None else 0

    def strike(self, msg_id: str, blame: Blame) -> int:
        """One more crash blamed on ``msg_id`` (by ``blame``): the count."""
        if not self.limit:
            return 0
        rec = self._table.get(msg_id)
        if rec is None:
            rec = self._table[msg_id] = Record(0, blame)
            while len(self._table) > self.cap:
                self._table.popitem(last=False)
                self.evicted += 1
        else:
            self._table.move_to_end(msg_id)
        rec.crashes += 1
        rec.last = blame
        return rec.crashes

    def verdict(self, msg_id: str) -> str | None:
        """The failure reason if ``msg_id`` is poison (``limit`` crashes or more), else None."""
        rec = self._table.get(msg_id)
        if rec is None or not self.limit or rec.crashes < self.limit:
            return None
        times = "once" if rec.crashes == 1 else f"{rec.crashes} times"
        return f"{POISON_REASON}killed a processor {times} (last: {rec.last.child} {rec.last.how})"

    def forget(self, msg_id: str) -> bool:
        """The message settled: its crashes no longer matter.  False if none were known."""
        return self._table.pop(msg_id, None) is not None

    def records(self) -> list[tuple[str, Record]]:
        """Every struck id with its record, oldest first (the order the cap drops them)."""
        return list(self._table.items())

    def restore(self, msg_id: str, crashes: int, last: Blame) -> None:
        """A record a previous producer of ours kept (:meth:`PoisonGuard.restore`)."""
        if self.limit and crashes > 0:
            self._table[msg_id] = Record(crashes, last)
            while len(self._table) > self.cap:
                self._table.popitem(last=False)
                self.evicted += 1


@dataclass(frozen=True)
class Verdict:
    """What a blame did, for the producer's log line: ``struck`` a message (``poison`` when
    that was its last allowed crash), or ``isolated`` a frame's messages."""

    what: str
    msg_id: str = ""
    crashes: int = 0


class PoisonGuard:
    """The producer's poison state: strikes, isolated ids, emitted suspects, quarantine.

    ``stage_id`` names the producer in the guard's log lines; ``struck`` and ``failed``
    count the crashes blamed on our messages and the poison messages settled as failed
    (the producer reports them as ``poison_strikes`` and ``poison_failed``)."""

    def __init__(self, max_crashes: int, cap: int = DEFAULT_CAP, stage_id: str = "") -> None:
        self.stage_id = stage_id
        self.struck = 0
        self.failed = 0
        self.strikes = StrikeTable(limit=max_crashes, cap=cap)
        #: ids of a prepare_messages frame that died: each goes alone next time
        self.isolate: set[str] = set()
        #: token -> id of emitted messages that are struck or isolated (to forget on settle)
        self.watch: dict[int, str] = {}
        #: suspects are kept back until the daemon's ``release_suspects``
        self.quarantine = False
        self.cap = cap
        #: bumped whenever the books (strikes, isolated ids) change: the producer writes
        #: them out then (:meth:`books`), not on every settle
        self.revision = 0

    def __len__(self) -> int:
        """Suspects known (struck or isolated ids)."""
        return len(self.strikes) + len(self.isolate)

    @property
    def active(self) -> bool:
        """Whether new events must be looked at (:meth:`mark`): false in the common case."""
        return bool(self.strikes) or bool(self.isolate)

    def blame(self, blame: Blame, ours: Callable[[object], bool]) -> Verdict | None:
        """A processor died running messages of ours (``ours(token)``: issued by this
        incarnation): strike the one it was running, or isolate the frame it was
        preparing.  None when nothing of ours was named (or poison handling is off)."""
        if not self.strikes.limit:
            return None
        suspects = [s for s in blame.suspects if ours(s.token)]
        if not suspects:
            return None
        if blame.kind == "handle_message" or (len(suspects) == 1 and blame.frame_size == 1):
            msg_id = suspects[0].id
            n = self.strikes.strike(msg_id, blame)
            self.revision += 1
            poison = self.strikes.verdict(msg_id) is not None
            return Verdict("poison" if poison else "struck", msg_id, n)
        if len(self.isolate) + len(suspects) > self.cap:
            self.isolate.clear()
        self.isolate.update(s.id for s in suspects)
        self.revision += 1
        return Verdict("isolated")

    def mark(self, events: list[list], failed: dict[int, str]) -> None:
        """Events fetched again: suspects among them are watched until settled, and poison
        ones marked failed (``failed``: token -> why, the producer's)."""
        strikes, isolate, watch = self.strikes, self.isolate, self.watch
        for ev in events:
            msg_id = protocol.event_id(ev)
            if msg_id in strikes or msg_id in isolate:
                token = protocol.event_token(ev)
                watch[token] = msg_id
                if token not in failed:
                    verdict = strikes.verdict(msg_id)
                    if verdict is not None:
                        failed[token] = verdict

    def split(self, events: list[list], failed: dict[int, str]
              ) -> tuple[list[list], list[list], list[list]]:
        """(the others, dispatched as usual; suspects to run, each alone in its frame;
        suspects kept back by the quarantine).  Failed suspects are not run: they go with
        the others."""
        watch = self.watch
        token_of = protocol.event_token
        if not any(token_of(ev) in watch and token_of(ev) not in failed for ev in events):
            return events, [], []
        rest: list[list] = []
        alone: list[list] = []
        for ev in events:
            token = token_of(ev)
            if token in watch and token not in failed:
                alone.append(ev)
            else:
                rest.append(ev)
        if self.quarantine:
            return rest, [], alone
        return rest, alone, []

    def settled(self, ok: list, failed: list, in_flight: Callable[[object], bool]) -> int:
        """Settled suspects are done with: their crash counts go (bounded memory).  Returns
        how many poison messages this settles as failed (counted here, once: one may be
        emitted failed more than once if a requeue overtakes it)."""
        watch = self.watch
        fails = [f[0] for f in failed if isinstance(f, (list, tuple)) and f]
        poison = 0
        for t in list(ok) + fails:
            try:
                msg_id = watch.pop(t, None)
            except TypeError:         # an unhashable token off the wire
                continue
            if msg_id is None:
                continue
            if t in fails and in_flight(t) and self.strikes.verdict(msg_id):
                poison += 1
            struck = self.strikes.forget(msg_id)
            if struck or msg_id in self.isolate:
                self.isolate.discard(msg_id)
                self.revision += 1
        return poison

    def requeued(self, quarantine: bool) -> None:
        """Everything in flight went back to the source: no emitted token is watched any
        more (the ids stay struck); ``quarantine`` while the processors restart."""
        self.watch.clear()
        if quarantine:
            self.quarantine = True

    def release(self) -> None:
        """The processors are back: suspects may run again (one per frame)."""
        self.quarantine = False

    def books(self) -> dict:
        """What the crashes taught, as plain data (the file of :mod:`.books`): each struck
        id with its crashes and the last crash's processor and end (the verdict names
        them), and the isolated ids."""
        return {"strikes": [[msg_id, rec.crashes, rec.last.kind, rec.last.child, rec.last.how]
                            for msg_id, rec in self.strikes.records()],
                "isolate": sorted(self.isolate)}

    def restore(self, books: dict) -> int:
        """A previous producer's :meth:`books` (the same producer index, the same daemon
        run): its crashes count here, so a message keeps the count it reached.  Entries
        that do not check are left out.  Returns how many ids were taken."""
        if not self.strikes.limit:
            return 0
        taken = 0
        for entry in books.get("strikes") or ():
            try:
                msg_id, crashes, kind, child, how = entry
            except (TypeError, ValueError):
                continue
            if isinstance(msg_id, str) and isinstance(crashes, int) and crashes > 0:
                self.strikes.restore(msg_id, crashes, Blame(str(kind), (), 1, str(child),
                                                            str(how)))
                taken += 1
        ids = [i for i in books.get("isolate") or () if isinstance(i, str)]
        self.isolate.update(ids[:self.cap])
        return taken + len(ids[:self.cap])

    # -- the producer's fixed points ------------------------------------------------------
    def on_fetched(self, events: list[list], failed: dict[int, str]) -> None:
        """New events from the source: suspects among them are watched, poison ones are
        marked failed (``failed``: the producer's token -> why)."""
        if self.strikes or self.isolate:
            self.mark(events, failed)

    def on_dispatch(self, events: list[list], failed: dict[int, str]
                    ) -> tuple[list[list], list[list], list[list]]:
        """Events about to go out: (the others, as usual; suspects, each alone in a frame;
        suspects kept back by the quarantine)."""
        if not self.watch:
            return events, [], []
        return self.split(events, failed)

    def on_settled(self, ok: list, failed: list, in_flight: Callable[[object], bool]) -> None:
        """Acks arrived (before the in-flight table settles them: ``in_flight`` still
        answers for their tokens)."""
        if self.watch:
            self.failed += self.settled(ok, failed, in_flight)

    def on_requeue(self, blame: Blame | None, quarantine: bool,
                   ours: Callable[[object], bool]) -> None:
        """Everything in flight went back to the source, after a crash that ``blame``
        names (None: no processor died on its own); ``quarantine`` while they restart."""
        if blame is not None:
            verdict = self.blame(blame, ours)
            if verdict is not None:
                self._log(verdict, blame)
        self.requeued(quarantine)

    def on_release(self) -> None:
        """The processors are back after a crash: suspects run again, one per frame."""
        self.release()

    def _log(self, verdict: Verdict, blame: Blame) -> None:
        sid, child, how = self.stage_id, blame.child, blame.how
        if verdict.what == "isolated":
            log.warning("%s: %s %s in prepare_messages of a frame of %s messages; they are "
                        "requeued and each runs alone next time, to find the one at fault",
                        sid, child, how, blame.frame_size)
            return
        self.struck += 1
        if verdict.what == "poison":
            log.error("%s: message %s is poison: it killed a processor %d times (last: "
                      "%s %s); it is failed (dead-lettered) instead of run again",
                      sid, verdict.msg_id, verdict.crashes, child, how)
        else:
            log.warning("%s: message %s was running when %s %s (crash %d of %d allowed); "
                        "requeued, it will run alone", sid, verdict.msg_id, child, how,
                        verdict.crashes, self.strikes.limit)
