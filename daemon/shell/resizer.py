"""Carrying out a resize on the running pipeline: the shell of :mod:`..core.resize`'s plan.

``offbroadway scale`` and a reload that changes a ``concurrency`` come here: the pure
planner (:mod:`..core.resize`) orders the steps (change the specs, adopt the new topology, start
new stages, have removed ones leave and wait for their ``left``, remove them, move the
prefetch windows), and :class:`Resizer` carries them out on the daemon's tree, one resize
at a time.  A stage that does not finish leaving within ``shutdown_timeout`` is restarted
out as a crash would be (what it held goes back to the source once).
"""

from __future__ import annotations

import asyncio
import logging
import time

from offbroadway.stages.wire import commands
from offbroadway.supervision import SupervisionError

from ..config.records import Config
from ..config.records import warnings as config_warnings
from ..core import resize as resize_mod
from ..core import topology as topo_mod
from ..core.pipeline import PipelineState, Shell, TreeHandle, adopt
from ..core.reactions import Send

log = logging.getLogger("offbroadway.daemon")


class Stopped(Exception):
    """A stop began in the middle of a resize: the tree stops as it is."""


class Resizer:
    """Carries out resizes on the running pipeline (``state``, ``tree``), one at a time.
    Which stages are leaving is the state's record (:meth:`PipelineState.still_leaving`),
    kept once for the reactions, status and the operator."""

    def __init__(self, state: PipelineState, tree: TreeHandle, shell: Shell) -> None:
        self.state = state
        self.tree = tree
        self.shell = shell
        self.lock = asyncio.Lock()

    async def scale(self, words: object) -> dict:
        """``offbroadway scale processors N`` / ``batch_processors KEY N``."""
        try:
            if not isinstance(words, list):
                raise resize_mod.ResizeRefused(f"usage: {resize_mod.USAGE}")
            new = resize_mod.resized(self.state.config, resize_mod.parse(words))
        except resize_mod.ResizeRefused as exc:
            return {"ok": False, "error": f"scale refused: {exc}"}
        return await self.resize(new, "offbroadway scale")

    async def resize(self, new_config: Config, why: str) -> dict:
        """Take the running pipeline to ``new_config``'s concurrencies (:mod:`..core.resize`):
        the planner orders the steps, this carries them out."""
        state = self.state
        if self.shell.stopping or state.terminator.draining:
            return {"ok": False, "error": f"{why} refused: the pipeline is stopping"}
        async with self.lock:
            old = state.topology
            new = state.wire(new_config)
            steps = resize_mod.plan(old, new)
            if not steps:
                return {"ok": True, "message": f"nothing to change: {resize_mod.shape(old)}"}
            change = resize_mod.change(old, new)
            log.info("%s: %s", why, change)
            for line in sorted(set(config_warnings(new_config)) -
                               set(config_warnings(state.config))):
                log.warning("%s: %s", why, line)     # e.g. a fixed prefetch now too small
            try:
                await self._carry_out(steps, new_config, new)
            except (SupervisionError, Stopped) as exc:
                log.error("%s: %s not completed: %s", why, change, exc)
                return {"ok": False, "error": f"{why}: {change} not completed: {exc}"}
            finally:
                self.tree.refresh()   # /metrics shows the new shape now
            log.info("%s: done, %s", why, resize_mod.shape(new))
            return {"ok": True, "message": change}

    async def _carry_out(self, steps: list[resize_mod.Step], config: Config,
                         topology: topo_mod.Topology) -> None:
        state, shell = self.state, self.shell
        for step in steps:
            if shell.stopping:
                raise Stopped("the pipeline is stopping")
            op = step.op
            if op == resize_mod.ADOPT:
                # the tree takes the new specs, then the state (pipeline.adopt)
                await adopt(state, self.tree, config, topology)
            elif op == resize_mod.START:
                try:
                    await self.tree.supervisor(step.supervisor).restart_child(step.stage)
                except SupervisionError as exc:
                    if not str(exc).startswith(("running:", "restarting:")):
                        raise
                    # a crash's restart built the new shape meanwhile and started it
            elif op == resize_mod.SUBSCRIBE:
                # not connected: that batcher is restarting, with the new processor in its spec
                shell.send([Send(step.stage, commands.Subscribe(step.peer))])
            elif op == resize_mod.LEAVE:
                shell.send([Send(step.stage, commands.Leave())])
            elif op == resize_mod.AWAIT_LEFT:
                await self._await_left(step.stages)
            elif op == resize_mod.REMOVE:
                sup = self.tree.supervisor(step.supervisor)
                if step.stage in [c.id for c in sup.children]:
                    await sup.terminate_child(step.stage)
                    await sup.delete_child(step.stage)
            elif op == resize_mod.WINDOW:
                shell.send([Send(step.stage, commands.Window(step.count))])
            elif op == resize_mod.FORGET:
                state.forget(step.stages)

    async def _await_left(self, stages: tuple[str, ...]) -> None:
        """Until every leaving stage said ``left`` (or is gone: a crash's restart built
        the new shape without it, and its messages were requeued).  One that has not
        within ``shutdown_timeout`` is restarted out as a crash would be: the new shape,
        and what it held requeued once (at-least-once), rather than a resize that hangs."""
        state, shell, tree = self.state, self.shell, self.tree

        def gone(stage: str) -> bool:
            return state.has_left(stage) or tree.find(stage) is None

        timeout = state.config.pipeline.shutdown_timeout
        await shell.wait_for(lambda: all(map(gone, stages)) or shell.stopping,
                             time.monotonic() + timeout)
        if shell.stopping:
            raise Stopped("the pipeline is stopping")
        late = [s for s in stages if not gone(s)]
        for stage in late:
            node = tree.find(stage)
            if node is None or node.parent is None:
                continue              # gone with the restart of an earlier one
            target = state.reactions.operator_restart(node.parent.id)
            log.warning("resize: %s did not finish leaving within %gs; restarting %s (what "
                        "it holds goes back to the source)", stage, timeout, target)
            await tree.restart(target)
