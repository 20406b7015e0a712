"""The stop budget: the longest a stop can take, from SIGTERM to the daemon's exit.

A stop is the drain (bounded by ``pipeline.shutdown_timeout``) followed by the stop of
the supervision tree, in which every worker is stopped in turn (OTP order: reverse start
order, one child after the other) and may use its whole ``shutdown`` grace after SIGTERM
before it is SIGKILLed.  The budget is the sum of those bounds, computed from the same
specs the supervisors obey, so it cannot drift from what they do.  The daemon announces
it to systemd in full when a stop begins (``EXTEND_TIMEOUT_USEC``) and enforces it: a tree
still stopping when its share runs out is SIGKILLed, so systemd never has to.

With the example config (``shutdown_timeout = 60``, local Spark, two processors) this is
166 s; ``offbroadway check`` prints it for any config.
"""

from __future__ import annotations

from offbroadway.supervision.spec import ChildSpec
from offbroadway.supervision.tree import stop_bound

#: SIGKILL to reaped, per worker: the kernel frees a big process (a JVM) in well under this.
KILL_SLACK = 1.0
#: the daemon's own work around a stop: final reports, closing sockets, exit.
MARGIN = 5.0


def total(shutdown_timeout: float, root: ChildSpec) -> float:
    """The whole stop: drain, then the tree (as its supervisors stop it:
    :func:`~offbroadway.supervision.tree.stop_bound`), then the daemon's margin."""
    return float(shutdown_timeout) + stop_bound(root, KILL_SLACK) + MARGIN
