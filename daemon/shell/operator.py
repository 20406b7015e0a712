"""The operator's verbs on the control socket: status, stop, restart, drain, resume, reload,
rate-limit, scale.

:mod:`..cli.control` carries the requests (one JSON object per connection); this module
answers them, one method per verb (:data:`Operator.VERBS`), acting on the running pipeline
(:class:`..core.pipeline.PipelineState`: the reactions, for which an operator's restart is the
cascade a crash would be), its tree (:class:`..core.pipeline.TreeHandle`), the resizer and the
few things of the daemon's shell it needs (:class:`..core.pipeline.Shell`: the hub's commands,
the reload, the stop).  A new verb is a method and
a line in ``VERBS``.  Every answer is ``{"ok": bool, ...}``; a refusal says why in one line.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable

from offbroadway.stages.flow import ratelimit
from offbroadway.stages.wire import commands
from offbroadway.supervision import SupervisionError
from offbroadway.supervision.tree import snapshot_nodes

from ..core.pipeline import PipelineState, Shell, TreeHandle
from ..core.reactions import Send
from ..core.status import TERMINATOR
from .resizer import Resizer

log = logging.getLogger("offbroadway.daemon")

Answer = dict

#: how long ``restart`` waits for the producers' reports of their requeue (a tick and a half)
REPORT_WAIT = 1.5


def _worker_pids(tree: dict) -> dict[str, int | None]:
    """Worker id -> pid in a tree snapshot (a restarted worker has a new pid)."""
    return {n["id"]: n.get("pid") for n in snapshot_nodes(tree) if n["kind"] == "worker"
            and n["id"] != TERMINATOR}


def _restarted(child_id: str, restarted: list[str], requeued: int) -> str:
    """What ``offbroadway restart`` did, in one line."""
    cascade = "" if restarted == [child_id] else f" (the cascade of {child_id})"
    return (f"restarted {', '.join(restarted) or 'nothing'}{cascade}; {requeued} in-flight "
            f"message{'' if requeued == 1 else 's'} requeued at the source")


class Operator:
    def __init__(self, state: PipelineState, tree: TreeHandle, shell: Shell,
                 resizer: Resizer) -> None:
        self.state = state
        self.tree = tree
        self.shell = shell
        self.resizer = resizer
        #: drained by ``offbroadway drain``: producers fetch nothing until ``resume``
        self.paused = False

    async def handle(self, req: dict) -> Answer:
        verb = self.VERBS.get(str(req.get("cmd")))
        if verb is None:
            return {"ok": False, "error": f"unknown command {req.get('cmd')!r}"}
        answer = await verb(self, req)
        if verb in self.CHANGES and (verb is not Operator.rate_limit or "limit" in req):
            # what an operator changed goes on the live page's timeline (a reload records
            # itself: SIGHUP reloads too)
            words = [w for k in ("child", "args", "limit") if k in req
                     for w in (req[k] if isinstance(req[k], list) else [req[k]])]
            args = " ".join(map(str, words))
            self.shell.timeline.add("operator", f"offbroadway {req['cmd']} {args}".strip(),
                                     answer.get("error") or answer.get("message") or "")
        return answer

    async def status(self, req: dict) -> Answer:
        return {"ok": True, "status": self.shell.status()}

    async def stop(self, req: dict) -> Answer:
        self.shell.request_stop("offbroadway stop")
        return {"ok": True, "pid": os.getpid()}

    async def restart(self, req: dict) -> Answer:
        state, tree, shell = self.state, self.tree, self.shell
        child_id = str(req.get("child", ""))
        if child_id == TERMINATOR:
            return {"ok": False, "error": "terminator runs inside the daemon; nothing to restart"}
        if tree.find(child_id) is None:
            ids = [n["id"] for n in snapshot_nodes(tree.snapshot())][1:]
            return {"ok": False, "error": f"no child with id {child_id!r}; children: "
                    f"{', '.join(ids)}"}
        if state.is_leaving(child_id):
            return {"ok": False, "error": f"{child_id} is leaving the pipeline (a resize "
                    f"removes it); nothing to restart"}
        # the same cascade as a crash of child_id (a processor's restart goes through
        # ProcessorSupervisor, so the batchers restart too), with one requeue
        before = _worker_pids(tree.snapshot())
        producers = state.topology.producers
        requeued = {p: state.board.totals.total(p, "requeued") for p in producers}
        held = {p: int(state.board.stats.get(p, {}).get("inflight") or 0) for p in producers}
        try:
            await tree.restart(state.reactions.operator_restart(child_id))
        except SupervisionError as exc:   # stopping, or a supervisor already gave up
            return {"ok": False, "error": f"cannot restart {child_id}: {exc}"}
        after = _worker_pids(tree.snapshot())
        restarted = [w for w, pid in after.items() if w in before and pid != before[w]]
        # the requeue went out with the cascade's Restarting; each live producer's next
        # report, a tick at most after the restart, has handed it back
        done = time.time()
        live = [p for p in producers if p not in restarted]
        await shell.wait_for(lambda: all(state.board.stats.get(p, {}).get("at", 0) > done
                                         for p in live), time.monotonic() + REPORT_WAIT)
        handed = sum(state.board.totals.total(p, "requeued") - requeued[p] for p in live)
        # a restarted producer's source takes back what it had in flight itself
        handed += sum(held[p] for p in producers if p in restarted)
        message = _restarted(child_id, restarted, handed)
        log.info("offbroadway restart: %s", message)
        return {"ok": True, "message": message, "restarted": restarted, "requeued": handed}

    async def drain(self, req: dict) -> Answer:
        if self.paused:
            return {"ok": True, "message": "already drained: nothing is fetched until resume"}
        self.paused = True
        log.info("drain requested: producers stop fetching, what is in flight finishes; "
                 "resume to fetch again")
        t = self.state.topology
        self.shell.send([Send(p, commands.Pause()) for p in t.producers] +
                        [Send(b, commands.Flush()) for b in t.batchers])
        return {"ok": True, "message": "draining: nothing new is fetched until resume"}

    async def resume(self, req: dict) -> Answer:
        if not self.paused:
            return {"ok": True, "message": "nothing to resume: the pipeline was not drained"}
        self.paused = False
        log.info("resume requested: producers fetch again")
        self.shell.send([Send(p, commands.Resume()) for p in self.state.topology.producers])
        return {"ok": True, "message": "resumed: fetching again"}

    async def reload(self, req: dict) -> Answer:
        return await self.shell.reload("offbroadway reload")

    async def scale(self, req: dict) -> Answer:
        """``offbroadway scale processors N`` / ``batch_processors KEY N``
        (:mod:`..core.resize`)."""
        return await self.resizer.scale(req.get("args"))

    async def rate_limit(self, req: dict) -> Answer:
        """Read the pipeline's rate limit, or change it (``limit``: "N/SECONDS" or "off");
        a change starts a fresh window at once."""
        shell = self.shell
        if "limit" in req:
            try:
                limit = ratelimit.parse(str(req["limit"]))
            except ValueError as exc:
                return {"ok": False, "error": str(exc)}
            assert shell.rate_limit is not None    # made before the control socket
            shell.rate_limit.set(limit)
            log.info("rate limit %s (offbroadway rate-limit)",
                     f"{limit[0]} messages per {limit[1]:g}s" if limit else "off")
        return {"ok": True, "rate_limit": ratelimit.describe(shell.rate_bucket())}

    #: the control socket's ``cmd`` -> its method
    VERBS: dict[str, Callable[[Operator, dict], Awaitable[Answer]]] = {
        "status": status, "stop": stop, "restart": restart, "drain": drain,
        "resume": resume, "reload": reload, "rate_limit": rate_limit, "scale": scale}
    #: the verbs that change the pipeline (the timeline lists them)
    CHANGES = (stop, restart, drain, resume, rate_limit, scale)
