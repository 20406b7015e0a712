"""The producer side of a stage: its ROUTER, its consumers' subscriptions and their demand.

Producers, processors (towards batchers) and batchers (towards batch processors) all bind
a ROUTER that consumers subscribe to; this class is that shared half, so the rules live in
one place: a subscription the dispatcher refuses is cancelled back ("bad subscription"), an
ask from a consumer we do not know is answered "unknown subscription" (we restarted: what
it had out here is void; the daemon tells it to subscribe again), a send that fails means
the consumer is gone (ROUTER_MANDATORY) and its events go back to be dispatched to the
others.  A subscription is answered SUBSCRIBED
with the dispatcher's policy (the consumer asks nothing before it), a RETRACT with
RETRACTED and the amount actually taken back; both answers go out after every event already
sent to that consumer, which is what makes the consumer's demand accounting exact
(:mod:`.demand`).  Events a consumer gives back unstarted (RETURN) go to ``on_return``
(producers put them back in their buffer; other stages refuse them as malformed).  A
consumer's CANCEL (it leaves the pipeline) is answered with a cancel, after everything
already sent to it.  Frames other than subscribe / ask / retract / return / cancel (a
producer's ACKs) are handed to the stage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import zmq

from ..flow.dispatch import Dispatcher
from ..wire import protocol

#: frames read per wake-up before the stage's other sockets get a turn
READ_BURST = 1000


class Downstream:
    def __init__(self, stage: Any, dispatcher: Dispatcher,
                 on_frame: Callable[[bytes, list], None] | None = None,
                 on_change: Callable[[], None] = lambda: None,
                 on_return: Callable[[bytes, list], None] | None = None) -> None:
        self.stage = stage
        self.dispatcher = dispatcher
        self.on_frame = on_frame
        self.on_return = on_return
        self.on_change = on_change
        self.closed = False          # after cancel_all: late subscribers are told at once
        stage.counters.setdefault("frames", 0)
        self.sock = stage.router()
        stage.register(self.sock, self._on_frames)

    def _on_frames(self, sock: zmq.Socket) -> None:
        stage = self.stage
        # readiness from the socket's EVENTS, not a zmq.Again raised at the end of every read
        for _ in range(READ_BURST):
            if not sock.get(protocol.ZMQ_EVENTS) & protocol.ZMQ_POLLIN:
                break
            parts = sock.recv_multipart(zmq.NOBLOCK)
            if len(parts) != 2:       # not one of ours
                stage.counters["malformed"] += 1
                continue
            peer, frame = parts
            msg = stage.decode(frame, peer.decode(errors="replace"))
            if msg is None:
                continue
            kind = msg[protocol.KIND_AT]
            if kind == protocol.ASK:
                try:
                    self.dispatcher.ask(peer, msg[protocol.VALUE])
                except KeyError:
                    self.send(peer, protocol.cancel(protocol.CANCEL_UNKNOWN))
            elif kind == protocol.RETRACT:
                try:
                    taken = self.dispatcher.retract(peer, msg[protocol.VALUE])
                except KeyError:
                    self.send(peer, protocol.cancel(protocol.CANCEL_UNKNOWN))
                else:
                    self.send(peer, protocol.retracted(taken))
            elif kind == protocol.SUBSCRIBE:
                try:
                    self.dispatcher.subscribe(peer, msg[protocol.SUBSCRIBE_MAX],
                                              msg[protocol.SUBSCRIBE_PARTITION])
                except ValueError as exc:
                    stage.counters["malformed"] += 1
                    self.send(peer, protocol.cancel(f"{protocol.CANCEL_BAD_SUBSCRIPTION}: {exc}"))
                    continue
                self.send(peer, protocol.subscribed(self.dispatcher.policy,
                                                      msg[protocol.SUBSCRIBE_REF]))
                if self.closed:
                    self.send(peer, protocol.cancel(protocol.CANCEL_SHUTDOWN))
            elif kind == protocol.RETURN:
                try:
                    if self.on_return is None:
                        raise protocol.ProtocolError("this stage takes nothing back")
                    events = protocol.open_events(msg[protocol.RETURN_PACKED])
                except protocol.ProtocolError:
                    stage.counters["malformed"] += 1
                else:
                    self.on_return(peer, events)
            elif kind == protocol.CANCEL:
                # a consumer leaving (a resize): forget it, and answer after every event
                # already sent to it, so it knows when nothing more is on its way
                self.dispatcher.cancel(peer)
                self.send(peer, protocol.cancel(protocol.CANCEL_UNSUBSCRIBED))
            elif self.on_frame is not None:
                self.on_frame(peer, msg)
        self.on_change()

    def send(self, peer: bytes, frame: bytes) -> bool:
        """False when the peer is gone (ROUTER_MANDATORY turns a silent drop into an error)."""
        try:
            self.sock.send_multipart([peer, frame], zmq.NOBLOCK)
            self.stage.counters["frames"] += 1
            return True
        except zmq.ZMQError:
            return False

    def deliver(self, items: list, encode: Callable[[list], bytes]) -> tuple[list, int]:
        """Dispatch ``items`` to demand, one frame per consumer (``encode`` of its share).

        Returns what could not be delivered (in order) and how many items were sent.  A
        consumer whose send fails is cancelled and its share kept for the others.
        """
        return self._deliver(items, lambda share: protocol.frames_within_limit(share, encode))

    def deliver_frames(self, items: list, frames: Callable[[list], list[tuple[bytes, list]]]
                       ) -> tuple[list, int]:
        """As :meth:`deliver`, with ``frames(share)`` making a consumer's frames (each with
        the items it carries): when a share's items cannot all share one frame header.
        ``frames`` may leave out items it cannot encode (having failed them); the
        consumer's demand for them is kept."""
        return self._deliver(items, frames)

    def deliver_each(self, items: list, encode: Callable[[Any], bytes]) -> tuple[list, int]:
        """As :meth:`deliver`, but one frame per item (a batch is one frame)."""
        return self._deliver(items, lambda share: [(encode(item), [item]) for item in share])

    def _deliver(self, items: list, frames: Callable[[list], list[tuple[bytes, list]]]
                 ) -> tuple[list, int]:
        if not items:
            return items, 0
        deliveries, leftovers = self.dispatcher.dispatch(items)
        sent = 0
        for consumer, share in deliveries:
            made = frames(share)
            dropped = len(share) - sum(len(carried) for _, carried in made)
            if dropped:
                # items ``frames`` could not encode (it failed them itself): the consumer
                # still wants as many, or its demand would shrink for good
                self.dispatcher.ask(consumer, dropped)
            for k, (frame, carried) in enumerate(made):
                if not self.send(consumer, frame):
                    self.dispatcher.cancel(consumer)
                    # from the first frame not sent, in the order the frames carried them
                    leftovers = [item for _, rest in made[k:] for item in rest] + leftovers
                    break
                sent += len(carried)
        return leftovers, sent

    def cancel_all(self, reason: str = protocol.CANCEL_SHUTDOWN) -> None:
        self.closed = True
        for consumer in self.dispatcher.consumers():
            self.send(consumer, protocol.cancel(reason))
