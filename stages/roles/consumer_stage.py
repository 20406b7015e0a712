"""The consumer cascade, written once: what a consuming stage does when its upstreams end.

Processors, batchers and batch processors consume through :class:`.consumer.Subscriptions`;
how a subscription ends, and what the stage does then, is the same for the three and is
written here, as Broadway writes it once for its stages (``Broadway.Topology.Subscriber``:
cancel, resubscribe, terminate when every producer is gone):

* **resubscribe** (the daemon's ``Resubscribe``): an upstream restarted, so it is
  subscribed to afresh; a stage told not to (``NoResubscribe``, the drain) or leaving
  counts it as done instead (:meth:`.consumer.Subscriptions.resubscribe_to`);
* **leave** (``Leave``: a resize removes the stage): ask nothing more and cancel every
  subscription; each upstream answers after the events it already sent;
* **finish**, once: when every upstream is done (it cancelled "shutdown", answered our
  "leaving", or restarted where we do not resubscribe) and the role holds nothing more
  (:meth:`ConsumerStage.holding`, the one thing each role says for itself), the stage ends
  its own stream.  It cancels its consumers, if it has any (a processor with batchers, a
  batcher), with the reason that tells them why; then a leaving stage reports ``Left``
  (its supervisor may stop it), and a *finisher*, a stage that acks and that nothing
  consumes (a processor without batchers, a batch processor), reports ``Done``: the
  drain's first wait (:attr:`daemon.topology.Topology.last`).  A stage that has
  consumers reports nothing: its consumers' cancel is how the end travels on.

"Drain" names one thing in the stages: **the drain**, the stop's (Broadway's shutdown
cascade, that the daemon's terminator runs on SIGTERM, ``offbroadway stop`` or
``--until-idle``): producers told ``Shutdown`` stop fetching, dispatch what they hold and
cancel their consumers "shutdown"; first-layer consumers are told ``NoResubscribe``; each
stage finishes as above.  Two other things were called so and are named apart:

* **the operator's pause** (``offbroadway drain``): producers ``Pause`` (fetch nothing)
  and batchers ``Flush`` (partial batches now); the pipeline stays up, nothing finishes,
  and ``resume`` undoes it;
* **reading out** a socket (a burst of frames until none waits) or an output falling
  back under its bound: no subscription ends.
"""

from __future__ import annotations

import logging
from typing import ClassVar

from ..runtime.spec import StageSpec
from ..runtime.stage import Stage, ZmqIO
from ..wire import commands, protocol
from .consumer import Subscriptions
from .downstream import Downstream


class ConsumerStage(Stage):
    """A stage that consumes from upstream stages (see the module's docstring)."""

    #: the cascade commands this role takes from the daemon (another is logged as not for
    #: it): batchers are never resized nor in the first layer, batch processors restart
    #: with their batcher (``rest_for_one``) and never resubscribe
    CASCADE: ClassVar[tuple[type[commands.Command], ...]] = (
        commands.Resubscribe, commands.NoResubscribe, commands.Leave)

    #: its upstreams (the role builds them: how it asks is its own)
    subs: Subscriptions
    #: its consumers, if it has any: cancelled when it finishes
    downstream: Downstream | None = None

    def __init__(self, spec: StageSpec, io: ZmqIO | None = None) -> None:
        super().__init__(spec, io)
        #: ended its stream (:meth:`finish`): once
        self.finished = False
        handlers = {commands.Resubscribe: self._on_resubscribe,
                    commands.NoResubscribe: self._on_no_resubscribe,
                    commands.Leave: self._on_leave}
        for command in self.CASCADE:
            self.accept(command, handlers[command])

    def holding(self) -> bool:
        """Whether the role still holds messages that must go on (or be written) before
        it may finish: the one part of the cascade each role says for itself."""
        raise NotImplementedError

    def maybe_finish(self) -> None:
        """:meth:`finish` once every upstream is done and the role holds nothing."""
        if self.finished or not self.subs.all_done or self.holding():
            return
        self.finished = True
        self.finish()

    def finish(self) -> None:
        """The end of this stage's stream (once, from :meth:`maybe_finish`)."""
        if self.downstream is not None:
            # "leaving": the consumers forget us once they have read what we sent
            self.downstream.cancel_all(protocol.CANCEL_LEAVING if self.leaving
                                       else protocol.CANCEL_SHUTDOWN)
        # final counts: the last tick may be older
        if self.leaving:
            self.report(commands.Left(self.stats()))
        elif self.downstream is None:
            # a finisher: nothing consumes from it, so the drain waits for this
            self.report(commands.Done(self.stats()))

    # -- the daemon's cascade commands --------------------------------------------------------
    def _on_resubscribe(self, command: commands.Resubscribe) -> None:
        self.subs.resubscribe_to(command.upstream)
        self.maybe_finish()      # leaving, or in the drain, a restarted upstream is done

    def _on_no_resubscribe(self, _: commands.NoResubscribe) -> None:
        self.subs.resubscribe = False

    def _on_leave(self, _: commands.Leave) -> None:
        """A resize removes this stage: stop asking, cancel every subscription, finish
        what was received and send on (or write) what is held, then report ``left`` (the
        daemon stops us as a planned stop: nothing is requeued)."""
        if self.leaving:
            return
        logging.getLogger(f"offbroadway.{self.spec.role}").info(
            "%s: leaving the pipeline (resize): finishing what it holds", self.id)
        self.leaving = True
        self.subs.leave()
        self.maybe_finish()
