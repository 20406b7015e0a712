"""The idle probe: when may the ``rabbitmq`` source say its queue is exhausted?

``--until-idle`` drains once every source is exhausted, so "nothing buffered" is not
enough: a delivery may be on its way.  The queue counts as empty after two passive
``queue.declare`` probes in a row answered 0 with no delivery in between (one alone can
overtake a delivery already sent).  The same probes say when the queue cannot empty: every
message still in circulation failed in this run and is requeued by the failure policy
(:meth:`~.settle.Settlement.only_failures_left`, two answers in a row with no new message
delivered between them); ``--until-idle`` then stops too, and its last line says how many
stay in the queue.  Probes run only while the producer asks
(:meth:`IdleProbe.asked`), so a source nobody asks costs the broker nothing.  Pure: the
I/O thread sends the probe and reports the answer.
"""

from __future__ import annotations

#: seconds between probes while the producer asks
PROBE_INTERVAL = 0.1
#: the producer's last question counts this long
ASKED_WINDOW = 2.0


class IdleProbe:
    def __init__(self, interval: float = PROBE_INTERVAL) -> None:
        self.interval = interval
        #: set by the producer thread (one assignment), read by the I/O thread
        self.asked_at = 0.0
        #: set by the I/O thread, read by the producer thread
        self.empty_confirmed = False
        #: answers of 0 in a row with no delivery between them
        self.zero_probes = 0
        self._next = 0.0

    def asked(self, now: float) -> None:
        self.asked_at = now

    def delivered(self) -> None:
        """A delivery came (or the connection is new): nothing is confirmed."""
        self.empty_confirmed = False
        self.zero_probes = 0
        self.failing_probes = 0
        self.only_failures = False

    def due(self, now: float, *, paused: bool, buffered: int) -> bool:
        """Whether to probe now; when it says so, the next probe is an interval away."""
        if now < self._next or now - self.asked_at > ASKED_WINDOW or paused:
            return False
        if buffered:
            self.zero_probes = 0
            return False
        self._next = now + self.interval
        return True

    def answered(self, message_count: int, *, delivered_meanwhile: bool,
                 only_failures: bool = False) -> None:
        """``only_failures``: what the settlement said of ``message_count`` (see above)."""
        if message_count == 0 and not delivered_meanwhile:
            self.zero_probes += 1
        else:
            self.zero_probes = 0
        self.empty_confirmed = self.zero_probes >= 2
        if only_failures and not delivered_meanwhile:
            self.failing_probes += 1
        else:
            self.failing_probes = 0
        self.only_failures = self.failing_probes >= 2

    def failed(self) -> None:
        """The probe itself failed (the queue is gone): nothing is confirmed."""
        self.empty_confirmed = False
        self.only_failures = False
