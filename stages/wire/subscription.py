"""GenStage's subscription and demand on the wire: subscribe, ask, retract, cancel.

=============  ====================  ====================================================
kind           direction             fields
=============  ====================  ====================================================
SUBSCRIBE      consumer → producer   max_demand, min_demand, partition (or None), ref (int)
SUBSCRIBED     producer → consumer   policy (str): the producer's dispatcher, "spread",
                                     "demand" or "partition"; ref echoed from SUBSCRIBE
ASK            consumer → producer   n (new demand, added to what is outstanding)
RETRACT        consumer → producer   n: take back up to n of the consumer's unmet demand
RETRACTED      producer → consumer   k: how much was taken back (k ≤ n, k ≤ unmet demand)
CANCEL         either way            reason (str); from a producer it also means "done"
=============  ====================  ====================================================

SUBSCRIBED and RETRACTED are exact because ZeroMQ keeps order per connection: every event
the producer sent before answering reaches the consumer before the answer, so after
SUBSCRIBED the consumer's unmet demand there is exactly 0, and after RETRACTED k it is
exactly what it was minus the events received minus k (see :mod:`..flow.demand`).  The
ref tells the answer to the latest SUBSCRIBE from the answer to an earlier one (a
subscription sent again after a producer restart can meet one still queued for the new
incarnation).  The frames' shapes are checked by :func:`.frames.decode`.
"""

from __future__ import annotations

from typing import Any

from .frames import ASK, CANCEL, RETRACT, RETRACTED, SUBSCRIBE, SUBSCRIBED, frame

#: field positions in a decoded frame (``VALUE`` is :mod:`.frames`')
SUBSCRIBE_MAX, SUBSCRIBE_MIN, SUBSCRIBE_PARTITION, SUBSCRIBE_REF = 1, 2, 3, 4
SUBSCRIBED_POLICY, SUBSCRIBED_REF = 1, 2

#: Why a subscription ends: the reason a CANCEL carries (GenStage's cancel reasons, as
#: named constants: every stage compares against these, never a string of its own).
#: The upstream ended its stream (the stop's drain, or it stops): no more events will come.
CANCEL_SHUTDOWN = "shutdown"
#: A consumer a resize removes is leaving; its producer answers with the same reason,
#: after every event it sent, so everything sent arrived before the answer.
CANCEL_LEAVING = "leaving"
#: An ask or a cancel for a subscription this producer does not know (it restarted): what
#: the consumer had out there is void, and the daemon's resubscribe follows.
CANCEL_UNKNOWN = "unknown subscription"
#: The answer to a consumer's cancel of a subscription that is not leaving.
CANCEL_UNSUBSCRIBED = "unsubscribed"
#: A subscription the dispatcher refuses (a partition it does not have…): the reason
#: follows this prefix, ``"bad subscription: <why>"``.
CANCEL_BAD_SUBSCRIPTION = "bad subscription"


def subscribe(max_demand: int, min_demand: int, partition: Any = None, ref: int = 0) -> bytes:
    return frame(SUBSCRIBE, max_demand, min_demand, partition, ref)


def subscribed(policy: str, ref: int) -> bytes:
    return frame(SUBSCRIBED, policy, ref)


def ask(n: int) -> bytes:
    return frame(ASK, n)


def retract(n: int) -> bytes:
    return frame(RETRACT, n)


def retracted(k: int) -> bytes:
    return frame(RETRACTED, k)


def cancel(reason: str) -> bytes:
    return frame(CANCEL, reason)
