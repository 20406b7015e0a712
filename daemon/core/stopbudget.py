"""The stop budget: the longest a stop can take, from SIGTERM to the daemon's exit.

A stop is the drain (bounded by ``pipeline.shutdown_timeout``) followed by the stop of
the supervision tree, in which every worker is stopped in turn (OTP order: reverse start
order, one child after the other) and may use its whole ``shutdown`` grace after SIGTERM
before it is SIGKILLed.  The budget is the sum of those bounds, computed from the same
specs the supervisors obey, so it cannot drift from what they do.  The daemon announces
it to systemd in full when a stop begins (``EXTEND_TIMEOUT_USEC``) and enforces it: a tree
still stopping when its share runs out is SIGKILLed, so systemd never has to.

This module is the one place the figure is computed: the daemon (:mod:`.pipeline`),
``offbroadway check`` (:func:`..spark.wiring.stop_budget`, over the tree as the daemon
wires it) and the example in docs/operations.md (:func:`explain`, held equal by
tests/daemon/test_stopbudget.py) all take it from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from offbroadway.supervision.spec import BRUTAL_KILL, INFINITY, ChildSpec, WorkerSpec
from offbroadway.supervision.tree import stop_bound, walk

if TYPE_CHECKING:
    from ..config.records import Config

#: SIGKILL to reaped, per worker: the kernel frees a big process (a JVM) in well under this.
KILL_SLACK = 1.0
#: the daemon's own work around a stop: final reports, closing sockets, exit.
MARGIN = 5.0


def total(shutdown_timeout: float, root: ChildSpec) -> float:
    """The whole stop: drain, then the tree (as its supervisors stop it:
    :func:`~offbroadway.supervision.tree.stop_bound`), then the daemon's margin."""
    return float(shutdown_timeout) + stop_bound(root, KILL_SLACK) + MARGIN


def explain(config: Config, root: ChildSpec) -> str:
    """The budget's terms, for people: ``60 s drain + 61 s batch processor + … + 5 s for
    the daemon = 227 s`` (each stage's grace plus :data:`KILL_SLACK`; when a supervisor's
    own shutdown caps its subtree the stages' sum is more than the tree's bound, and the
    line says so)."""
    from ..config.names import role_of

    terms: dict[tuple[str, float], int] = {}
    for spec in walk(root):
        if isinstance(spec, WorkerSpec):
            own = spec.shutdown
            bound = (KILL_SLACK if own == BRUTAL_KILL else
                     float("inf") if own == INFINITY else float(own) + KILL_SLACK)
            role = (role_of(spec.id) or spec.id).replace("_", " ")
            terms[(role, bound)] = terms.get((role, bound), 0) + 1
    parts = [f"{config.pipeline.shutdown_timeout:g} s drain"]
    for (role, bound), n in terms.items():
        parts.append(f"{n} × {bound:g} s {role}" if n > 1 else f"{bound:g} s {role}")
    parts.append(f"{MARGIN:g} s for the daemon")
    budget = total(config.pipeline.shutdown_timeout, root)
    line = " + ".join(parts) + f" = {budget:g} s"
    stages = sum(n * b for (_, b), n in terms.items())
    if stages != stop_bound(root, KILL_SLACK):
        line += " (a supervisor's own shutdown caps part of it)"
    return line
