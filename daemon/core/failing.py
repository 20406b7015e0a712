"""The pipeline's failed messages still in circulation, from its producers' notes.

A source that requeues failed messages (RabbitMQ's ``reject_and_requeue``, the first
failure under ``reject_and_requeue_once``) keeps per producer the messages that failed and
went back to the queue, so that it counts each once however often it comes back.  With
several producers on one queue, a message that failed on one of them can come back to
another and be acked or rejected there, or fail there again: each producer alone would
keep it as failing, or count it twice.  So the producers note to the daemon, with their
reports (``stats["notes"]``, ``[kind, digest, when]``), every failure that went back to
the queue (``NOTE_FAILED``) and every *redelivered* message they settled for good, acked
or rejected (``NOTE_SETTLED``): a first delivery cannot be in anyone's books, so the hot
path notes nothing.  A digest is ``hash()`` of the message's identity in the producer's
process; the producers of a daemon share their hash seed (``daemon/spark/wiring.py``), so
one message has one digest in all of them.  ``when`` is ``time.monotonic()``, one clock
for the processes of a host: notes come in reports a second apart, and the later event
wins whatever order its notes arrive in.

:class:`FailingLedger` keeps, per digest, the last failure and the producer it happened
on (that producer counts it); a settlement after it ends it.  A settlement whose failure
has not arrived yet (its producer reports later) is remembered for :data:`SETTLED_WINDOW`
seconds (at most :data:`SETTLED_MAX` of them), so the late failure is known as settled.
Each note that changes another producer's books becomes a :class:`~commands.Reconcile`
for it: what it must drop, and what failed again elsewhere (still failing, counted there).

Acks in doubt.  A producer killed while an ack frame was leaving (its tally says so:
:class:`~offbroadway.stages.runtime.tally.SentAcks`) leaves the books a frame the broker got
whole or not at all.  Not got, its messages come back redelivered, and their settlement (or
failure) is noted like any redelivered message's: a note of a digest in doubt, later than
the frame, takes that message out of doubt.  What is still in doubt when a run ends never
came back, so the broker got it: :meth:`FailingLedger.land_doubts` hands it to the books
as acked.  Until then ``status`` shows it apart (``acks_in_doubt``).

Several daemons on one queue remain out of reach: RabbitMQ does not tell a consumer what
the others settle.  Pure: the daemon hands the notes in and sends what comes out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from offbroadway.stages.wire import commands
from offbroadway.stages.wire.commands import NOTE_FAILED, NOTE_SETTLED

from .reactions import Send

#: how long a settlement is remembered for a failure noted late (reports come every
#: second; a producer's loop held up for longer than this is not expected)
SETTLED_WINDOW = 30.0
#: settlements remembered at most, the oldest going first (about 100 bytes each: a crashed
#: window of 65,000 deliveries redelivered and settled fits)
SETTLED_MAX = 100_000


class FailingLedger:
    def __init__(self) -> None:
        #: digest -> (when it last failed, the producer it failed on): the pipeline's
        #: failed messages back in the queue (or held before going back)
        self.failing: dict[int, tuple[float, str]] = {}
        #: digest -> when a redelivered message was settled for good, oldest first
        self._settled: dict[int, float] = {}
        self._latest = 0.0
        #: has any producer noted anything (a source that keeps these books)?
        self.noted = False
        #: producer -> the time of the last note its reports brought
        self._heard: dict[str, float] = {}
        #: digest -> [when its ack frame began to leave, the producer, how many of the
        #: frame's acks have it]: acks sent by a producer as it died, not in its counts
        self.in_doubt: dict[int, list] = {}

    def count(self, owners: Iterable[str] | None = None) -> int:
        """Failed messages still in circulation (those last failed on ``owners``)."""
        if owners is None:
            return len(self.failing)
        wanted = set(owners)
        return sum(1 for _, stage in self.failing.values() if stage in wanted)

    def take(self, stage: str, notes: object, producers: Iterable[str]) -> list[Send]:
        """``stage``'s notes; the :class:`~commands.Reconcile` each other producer of
        ``producers`` is owed because of them."""
        if not isinstance(notes, list):
            return []
        self.noted = True
        failing, settled = self.failing, self._settled
        drop: dict[str, list] = defaultdict(list)
        moved: dict[str, list] = defaultdict(list)
        peers = [p for p in producers if p != stage]
        for note in notes:
            try:
                kind, digest, when = note
                when = float(when)
            except (TypeError, ValueError):
                continue
            if not isinstance(digest, int):
                continue
            self._latest = max(self._latest, when)
            if when > self._heard.get(stage, 0.0):
                self._heard[stage] = when
            doubt = self.in_doubt.get(digest)
            if doubt is not None and doubt[0] < when:
                self._came_back(digest, doubt)
            last = failing.get(digest)
            if kind == NOTE_FAILED:
                ended = settled.get(digest)
                if ended is not None and ended > when:
                    drop[stage].append([digest, ended])     # settled since, elsewhere
                elif last is None or last[0] <= when:
                    failing[digest] = (when, stage)
                    if last is not None and last[1] != stage:
                        moved[last[1]].append([digest, when])
                elif last[1] != stage:
                    moved[stage].append([digest, last[0]])  # failed later elsewhere
            elif kind == NOTE_SETTLED:
                if last is not None and last[0] < when:
                    del failing[digest]
                    for p in peers:
                        drop[p].append([digest, when])
                settled.pop(digest, None)
                settled[digest] = when
        self._forget_old()
        return [Send(p, commands.Reconcile(settled=drop.get(p, []), moved=moved.get(p, [])))
                for p in sorted(set(drop) | set(moved))]

    def doubt(self, stage: str, when: float, digests: Iterable[int]) -> None:
        """The ack frame ``stage`` was sending as it died (``when`` it began to leave):
        in doubt, but for the messages heard of since (they came back)."""
        settled, failing, in_doubt = self._settled, self.failing, self.in_doubt
        for digest in digests:
            back = max(settled.get(digest, 0.0), failing.get(digest, (0.0, ""))[0])
            if back > when:
                continue
            entry = in_doubt.setdefault(digest, [when, stage, 0])
            entry[2] += 1

    def _came_back(self, digest: int, entry: list) -> None:
        entry[2] -= 1
        if entry[2] <= 0:
            del self.in_doubt[digest]

    def doubts(self, owners: Iterable[str] | None = None) -> int:
        """Acks in doubt (those sent by ``owners``)."""
        wanted = None if owners is None else set(owners)
        return sum(n for _, stage, n in self.in_doubt.values()
                   if wanted is None or stage in wanted)

    def land_doubts(self) -> dict[str, int]:
        """The run has ended: what is still in doubt never came back, so the broker got
        it; producer -> its acks to add to its books."""
        landed: dict[str, int] = defaultdict(int)
        for _, stage, n in self.in_doubt.values():
            landed[stage] += n
        self.in_doubt.clear()
        return dict(landed)

    def unheard(self, stage: str, notes: list[list]) -> list[list]:
        """Of the notes an exited producer kept (its notes file, oldest first), those its
        reports may not have brought: from the time of the last one they did (notes of
        one moment can be split between two reports; taken twice, a note changes
        nothing)."""
        heard = self._heard.get(stage, 0.0)
        return [n for n in notes if n[2] >= heard]

    def _forget_old(self) -> None:
        settled, horizon = self._settled, self._latest - SETTLED_WINDOW
        while settled:
            digest, when = next(iter(settled.items()))
            if when >= horizon and len(settled) <= SETTLED_MAX:
                return
            del settled[digest]
