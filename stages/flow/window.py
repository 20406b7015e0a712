"""A batch processor's demand on its batcher: a window that follows the pace of its work.

The processors' demand is :mod:`.demand`'s budget; a batch processor has one upstream (its
batcher) and needs only how many batches to ask for, which this pure class decides: the
consumer (:mod:`.consumer`) sends the asks it returns.  Why a window and not Broadway's
fixed ``max_demand: 1`` is in the class's docstring and in docs/design-demand.md.
"""

from __future__ import annotations

from .demand import EWMA, PREFETCH_SECONDS


class PacedWindow:
    """A batch processor's demand on its batcher: as many batches as it can start within
    :data:`PREFETCH_SECONDS` at the pace ``handle_batch`` has shown, between one and
    ``max_demand``.

    Broadway subscribes batch processors with ``max_demand: 1, min_demand: 0``, so a batch
    goes to a batch processor that is free and a slow sink gets all its batch processors
    working.  Asking for one batch at a time would cost a round trip per batch when
    ``handle_batch`` is fast, so the window follows the pace instead: one while a batch
    takes longer than the target (and before the first is timed: a batch processor that
    starts first must not take every batch before its siblings subscribe), up to
    ``max_demand`` when batches are quick.  Re-asks wait until half the window is free
    (GenStage's ``min_demand``; at a window of one, as soon as it is).

    Two counts bound it.  *Unstarted* batches (asked, not yet received; received ones are
    started at once) stay within the window.  *Held* ones, received and not finished (with
    Spark: handed to the committer and not yet committed), count against ``max_demand``
    only: the topology sizes that for group commit, and a batch waiting for its commit is
    not a batch waiting for this processor.  Pure: the consumer sends what it returns.
    """

    def __init__(self, max_demand: int, min_demand: int,
                 target_seconds: float = PREFETCH_SECONDS) -> None:
        if max_demand < 1 or not 0 <= min_demand < max_demand:
            raise ValueError(f"need 0 <= min_demand < max_demand, got {min_demand}/{max_demand}")
        self.max_demand = max_demand
        self.min_demand = min_demand
        self.target = target_seconds
        self.outstanding = 0     # asked, not received
        self.held = 0            # received, not finished
        #: seconds per batch (moving average), None until the first is timed
        self.pace: float | None = None

    @property
    def window(self) -> int:
        if self.pace is None:
            return 1
        if self.pace * self.max_demand <= self.target:
            return self.max_demand
        return max(1, int(self.target / self.pace))

    def subscribed(self) -> int:
        """A new subscription: the upstream holds no demand of ours.  What to ask."""
        self.outstanding = 0
        self.held = 0
        return self._ask(chunk=1)

    def received(self, n: int) -> None:
        self.outstanding = max(0, self.outstanding - n)
        self.held += n

    def timed(self, n: int, seconds: float) -> None:
        """``n`` batches took ``seconds`` (``handle_batch``): the pace."""
        if n <= 0:
            return
        sample = max(seconds, 0.0) / n
        self.pace = sample if self.pace is None else EWMA * sample + (1 - EWMA) * self.pace

    def finished(self, n: int) -> None:
        """``n`` held batches are done (acked); :meth:`asks` says what to ask then."""
        self.held = max(0, self.held - n)

    def asks(self) -> int:
        """What to ask now, once the free part is worth a frame (0: nothing)."""
        window = self.window
        chunk = max(1, min(self.max_demand - self.min_demand, -(-window // 2)))
        return self._ask(chunk)

    def _ask(self, chunk: int) -> int:
        want = min(self.window - self.outstanding,
                   self.max_demand - self.outstanding - self.held)
        if want < chunk:
            return 0
        self.outstanding += want
        return want
