"""OTP supervisors for OS processes, as objects on the owner's asyncio loop.

A supervisor holds no user code, so it needs no process of its own: it is an object whose
decisions are serialised by a lock, as an OTP supervisor's are by its mailbox.  Children
are :class:`~.worker.Worker` nodes (an OS process each) or nested :class:`Supervisor`
objects.  The decisions themselves are pure (:mod:`.strategy`, :mod:`.intensity`); this
module carries them out and reports what happened.

Escalation follows OTP: a supervisor whose restart intensity is exceeded terminates its
children and exits with reason ``shutdown``; its parent sees that as the exit of one of
its own children and applies its own strategy and intensity; at the root,
:meth:`Supervisor.wait_failed` completes and the owner exits non-zero.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar, Union

from .errors import SpecError, StartError, SupervisionError
from .events import Restarting, SupervisorGaveUp
from .intensity import RestartIntensity
from .spec import (
    BRUTAL_KILL,
    INFINITY,
    ChildSpec,
    Restart,
    Strategy,
    SupervisorSpec,
    WorkerSpec,
)
from .strategy import ChildView, ExitAction, exit_action, plan_restart
from .worker import Worker

log = logging.getLogger("offbroadway.supervision")

T = TypeVar("T")
Node = Union[Worker, "Supervisor"]
EventHandler = Callable[[object], None]


@dataclass(frozen=True)
class ChildInfo:
    """One row of :meth:`Supervisor.which_children` (OTP's ``{Id, Child, Type, Modules}``)."""

    id: str
    pid: int | None
    type: str
    state: str


class Supervisor:
    """A supervisor of OS processes with OTP's strategies, intensity and shutdown.

    States: ``stopped``, ``starting``, ``running``, ``restarting`` (carrying out a restart
    plan), ``stopping``, ``terminated`` (by its parent's ``terminate_child``), ``failed``
    (gave up, or its start failed).
    """

    kind = "supervisor"

    def __init__(self, spec: SupervisorSpec, on_event: EventHandler | None = None, *,
                 parent: Supervisor | None = None) -> None:
        if not isinstance(spec, SupervisorSpec):
            raise SpecError(f"not a SupervisorSpec: {spec!r}")
        self.spec = spec
        self.parent = parent
        self._on_event = on_event
        self.state = "stopped"
        self.restarts = 0
        self.children: list[Node] = []
        self._up = False  # between start() and the end of a stop, a give-up or a failed start
        self._started_once = False
        self._generation = 0
        self._retries = 0  # try_again tasks queued (OTP's try_again_restart messages)
        self._intensity = RestartIntensity(spec.max_restarts, spec.max_seconds)
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._failed: asyncio.Future[str] | None = None
        self._stopping: asyncio.Task[None] | None = None
        self._build_children()

    # -- identity ---------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def pid(self) -> None:
        return None  # an object in the owner's process, not a process of its own

    @property
    def alive(self) -> bool:
        """Has children that may be running (the parent's display state aside)."""
        return self._up

    @property
    def incarnation(self) -> int:
        return self._generation

    def _build_children(self) -> None:
        """Children from the spec (a restarted supervisor starts from its spec, as OTP);
        nodes are reused by id so their restart counts survive."""
        old = {c.id: c for c in self.children}
        kids: list[Node] = []
        for cs in self.spec.children:
            node = old.get(cs.id)
            if node is None or node.kind != cs.type:
                node = self._make_node(cs)
            else:
                node.spec = cs  # type: ignore[assignment]
            kids.append(node)
        self.children = kids

    def _make_node(self, cs: ChildSpec) -> Node:
        if isinstance(cs, WorkerSpec):
            return Worker(cs, self)
        if isinstance(cs, SupervisorSpec):
            return Supervisor(cs, parent=self)
        raise TypeError(f"not a child spec: {cs!r}")

    # -- events -----------------------------------------------------------------------------
    def emit(self, event: object) -> None:
        """Hand an event to the root's ``on_event``; a failing handler is logged, not fatal."""
        if self.parent is not None:
            self.parent.emit(event)
        elif self._on_event is not None:
            try:
                self._on_event(event)
            except Exception:
                log.exception("on_event failed for %r", event)

    # -- tasks ------------------------------------------------------------------------------
    def _spawn(self, coro: Coroutine[Any, Any, T], awaited: bool = False) -> asyncio.Task[T]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if not awaited:
            task.add_done_callback(self._log_failure)
        return task

    def _log_failure(self, task: asyncio.Task[Any]) -> None:
        """Nobody awaits a handler task: a failure in it must at least be seen."""
        if not task.cancelled() and task.exception() is not None:
            log.error("supervisor %s: internal error", self.id, exc_info=task.exception())

    async def _run_tracked(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` as a task that :meth:`stop` can cancel; tell the caller why."""
        task = self._spawn(coro, awaited=True)
        try:
            return await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if task.cancelled() and (me is None or not me.cancelling()):
                raise SupervisionError(f"supervisor {self.id} was stopped") from None
            raise

    # -- start ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the children in order, each only after the previous reported ready.

        If one fails, the ones already started are stopped in reverse order and
        :class:`StartError` names the child (with its path) and the reason, as OTP's
        ``{shutdown, {failed_to_start_child, Id, Reason}}``.
        """
        if self.alive:
            raise SupervisionError(f"supervisor {self.id} is already {self.state}")
        # Set up synchronously, so a stop() called right after sees a supervisor starting.
        if self._started_once:
            self.restarts += 1
        self._started_once = True
        self._generation += 1
        self._stopping = None
        self._retries = 0
        self._intensity = RestartIntensity(self.spec.max_restarts, self.spec.max_seconds)
        self._build_children()
        self.state = "starting"
        self._up = True
        try:
            await self._run_tracked(self._start())
        except SupervisionError as exc:
            if isinstance(exc, StartError):
                raise
            raise StartError(self.id, "stopped while starting") from None

    async def _start(self) -> None:
        async with self._lock:
            started: list[Node] = []
            for node in list(self.children):
                try:
                    await node.start()
                except StartError as exc:
                    err = exc.within(self.id)
                    log.error("supervisor %s: %s; stopping the %d children started before it",
                              self.id, err, len(started))
                    for done in reversed(started):
                        await self._terminate_node(done)
                    self.state = "failed"
                    self._up = False
                    raise err from None
                started.append(node)
            self.state = "running"
        log.info("supervisor %s (%s) started %d children", self.id,
                 self.spec.strategy.value, len(self.children))

    # -- stop -------------------------------------------------------------------------------
    async def stop(self) -> None:
        """Stop the children in reverse start order, each per its ``shutdown``.

        Pending restarts are cancelled first.  Safe to call twice or concurrently (the
        second call waits for the first), and when never started.
        """
        if self._stopping is None or (self._stopping.done() and self.alive):
            self._stopping = asyncio.ensure_future(self._stop())
        await asyncio.shield(self._stopping)

    async def _stop(self) -> None:
        if not self._started_once:
            return
        final = "failed" if self.state == "failed" else "stopped"
        self.state = "stopping"
        me = asyncio.current_task()
        pending = [t for t in self._tasks if t is not me and not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        async with self._lock:
            for node in reversed(self.children):
                await self._terminate_node(node)
        self.state = final
        self._up = False
        log.info("supervisor %s stopped", self.id)

    async def _terminate_node(self, node: Node, final_state: str = "stopped") -> None:
        """Terminate one child per its ``shutdown``; a nested supervisor's ``shutdown``
        bounds the stop of its whole subtree (``brutal_kill`` SIGKILLs it at once)."""
        if isinstance(node, Worker):
            await node.stop(final_state)
            return
        shutdown = node.spec.shutdown
        if shutdown == BRUTAL_KILL:
            node.kill_now()
            await node.stop()
        elif shutdown == INFINITY:
            await node.stop()
        else:
            try:
                await asyncio.wait_for(asyncio.shield(node.stop()), float(shutdown))
            except TimeoutError:
                log.warning("supervisor %s not stopped within its shutdown %gs: SIGKILL "
                            "to its subtree", node.id, float(shutdown))
                node.kill_now()
                await node.stop()
        if node.state in ("stopped", "failed"):
            node.state = final_state

    def kill_now(self) -> None:
        """SIGKILL every process of the subtree without waiting."""
        for node in reversed(self.children):
            node.kill_now()

    # -- exits and restarts -----------------------------------------------------------------
    def child_exited(self, node: Node, incarnation: object, normal: bool, reason: str) -> None:
        """Called (on the loop) when a started child exited on its own or gave up.

        Handling is queued behind whatever the supervisor is doing, as an OTP supervisor's
        ``'EXIT'`` message waits in its mailbox.
        """
        if self.alive:
            self._spawn(self._handle_exit(node, incarnation, normal, reason, self._generation))

    async def _handle_exit(self, node: Node, incarnation: object, normal: bool, reason: str,
                           generation: int) -> None:
        async with self._lock:
            if generation != self._generation or self.state not in ("running", "restarting"):
                return
            if node not in self.children or node.incarnation != incarnation or node.alive:
                return  # stale: that process was already replaced by a restart
            action = exit_action(node.spec.restart, normal)
            if action is ExitAction.DELETE:
                self.children.remove(node)
                log.info("supervisor %s: temporary child %s not restarted (%s)", self.id,
                         node.id, reason)
                return
            if action is ExitAction.KEEP:
                node.state = "terminated"
                log.info("supervisor %s: transient child %s not restarted (%s)", self.id,
                         node.id, reason)
                return
            await self._restart(node, reason, counted=True)

    async def _restart(self, failed: Node, reason: str, *, counted: bool,
                       strategy: Strategy | None = None) -> None:
        """Carry out the strategy's plan (the caller holds the lock).

        A child that fails to start counts as another restart, and the plan is tried again
        from it as OTP's ``try_again_restart`` does: as a new task queued on the lock, so
        the API (``terminate_child``, ``which_children``, an operator's restart…) and other
        exits are served between attempts, as OTP serves calls from its mailbox between
        them.  Until then the children still to start show ``restarting``.
        """
        strategy = strategy or self.spec.strategy
        if counted and not self._intensity.add(time.monotonic()):
            await self._give_up(reason)
            return
        views = [ChildView(c.id, c.alive, c.spec.restart) for c in self.children]
        plan = plan_restart(strategy, views, failed.id)
        log.info("supervisor %s (%s): %s; restarting %s", self.id, strategy.value, reason,
                 ", ".join(plan.start))
        self.state = "restarting"
        for cid in plan.terminate:
            await self._terminate_node(self._child(cid), final_state="restarting")
        for cid in plan.delete:
            self.children.remove(self._child(cid))
        starting = [self._child(cid) for cid in plan.start]
        for node in starting:
            node.state = "restarting"
        # every process the plan stops is gone: the owner can hand back what they held,
        # once, before any of them runs again
        self.emit(Restarting(self.id, tuple(plan.start), reason))
        for i, node in enumerate(starting):
            try:
                await node.start()
            except StartError as exc:
                for later in starting[i:]:
                    later.state = "restarting"
                self._retries += 1
                self._spawn(self._try_again(node, str(exc), strategy, self._generation))
                return
        self.state = "running"

    async def _try_again(self, node: Node, reason: str, strategy: Strategy,
                         generation: int) -> None:
        """OTP's ``try_again_restart``: dropped if, meanwhile, the child was started,
        terminated or deleted by someone else (or the supervisor stopped)."""
        async with self._lock:
            self._retries -= 1
            if generation != self._generation or self.state not in ("running", "restarting"):
                return
            if node in self.children and not node.alive and node.state == "restarting":
                await self._restart(node, reason, counted=True, strategy=strategy)
                return
            if not self._retries:
                # the children of the abandoned plan stay down, as OTP leaves them
                # (``undefined``) until a restart_child
                for child in self.children:
                    if child.state == "restarting" and not child.alive:
                        child.state = "terminated"
                self.state = "running"

    async def _give_up(self, reason: str) -> None:
        why = f"{self.id} gave up: {self._intensity.describe()}; last: {reason}"
        if self.parent is not None:
            # OTP's escalation: the parent's strategy decides (a supervisor that allows
            # no restart is built to hand every crash to its parent): the designed
            # cascade, not an error.  At the root nothing is left to restart it.
            log.warning("supervisor %s; cascade: %s's strategy takes over", why,
                        self.parent.id)
        else:
            log.error("supervisor %s", why)
        self.state = "stopping"
        for node in reversed(self.children):
            await self._terminate_node(node)
        self.state = "failed"
        self._up = False
        self.emit(SupervisorGaveUp(self.id, why))
        if self.parent is not None:
            # OTP exits with reason ``shutdown``: a permanent parent entry restarts it, a
            # transient or temporary one does not (OTP's do_restart).
            self.parent.child_exited(self, self._generation, True, why)
        else:
            fut = self._failed_future()
            if not fut.done():
                fut.set_result(why)

    def _failed_future(self) -> asyncio.Future[str]:
        if self._failed is None:
            self._failed = asyncio.get_running_loop().create_future()
        return self._failed

    async def wait_failed(self) -> str:
        """Completes with the reason when this supervisor gives up (meant for the root)."""
        return await asyncio.shield(self._failed_future())

    # -- operator ---------------------------------------------------------------------------
    async def restart_subtree_or_child(self, child_id: str) -> None:
        """Restart ``child_id`` (any depth) as if it had crashed: its supervisor applies its
        strategy (rest_for_one restarts the later siblings too), but this is an operator's
        act, so it does not count toward restart intensity.  The root's own id restarts
        every child of the root."""
        node = self.find(child_id)
        if node is None:
            raise SupervisionError(f"not_found: no child {child_id!r} under {self.id}")
        if node is self:
            await self._run_tracked(self._operator_restart(None))
            return
        assert node.parent is not None
        await node.parent._run_tracked(node.parent._operator_restart(node))

    async def _operator_restart(self, node: Node | None) -> None:
        async with self._lock:
            if self.state not in ("running", "restarting"):
                raise SupervisionError(f"supervisor {self.id} is {self.state}")
            if node is None:
                if not self.children:
                    return
                log.info("supervisor %s: operator restart of all children", self.id)
                await self._restart(self.children[0], f"operator restart of {self.id}",
                                    counted=False, strategy=Strategy.ONE_FOR_ALL)
                return
            if node not in self.children:
                raise SupervisionError(f"not_found: {node.id} is no longer a child of {self.id}")
            await self._restart(node, f"operator restart of {node.id}", counted=False)

    # -- OTP's supervisor API ---------------------------------------------------------------
    def _child(self, child_id: str) -> Node:
        for node in self.children:
            if node.id == child_id:
                return node
        raise SupervisionError(f"not_found: {child_id!r} is not a child of {self.id}")

    def which_children(self) -> list[ChildInfo]:
        """Direct children in start order (OTP lists them newest first; start order reads
        better and is what a status display wants).  A child between restart attempts is
        ``restarting`` with no pid, as OTP's ``restarting``; one whose start is under way is
        ``starting`` with its pid (OTP cannot answer during a start; we can)."""
        return [ChildInfo(n.id, n.pid, n.kind, n.state) for n in self.children]

    def count_children(self) -> dict[str, int]:
        """OTP's ``count_children``: specs, active, supervisors, workers.  ``active`` counts
        started children (a process still starting has not returned from OTP's
        ``start_link`` yet, and one being restarted is ``restarting`` there)."""
        return {"specs": len(self.children),
                "active": sum(1 for n in self.children if n.alive and n.state != "starting"),
                "supervisors": sum(1 for n in self.children if n.kind == "supervisor"),
                "workers": sum(1 for n in self.children if n.kind == "worker")}

    async def terminate_child(self, child_id: str) -> None:
        """Stop a direct child per its shutdown and keep its spec (temporary: drop it)."""
        await self._run_tracked(self._terminate_child(child_id))

    async def _terminate_child(self, child_id: str) -> None:
        async with self._lock:
            node = self._child(child_id)
            log.info("supervisor %s: terminate_child %s", self.id, child_id)
            await self._terminate_node(node, final_state="terminated")
            if node.spec.restart is Restart.TEMPORARY:
                self.children.remove(node)

    async def restart_child(self, child_id: str) -> None:
        """Start again a direct child that is not running (OTP: ``{error, running}`` else)."""
        await self._run_tracked(self._restart_child(child_id))

    async def _restart_child(self, child_id: str) -> None:
        async with self._lock:
            if self.state not in ("running", "restarting"):
                raise SupervisionError(f"supervisor {self.id} is {self.state}")
            node = self._child(child_id)
            self._refuse_if_busy(node)
            log.info("supervisor %s: restart_child %s", self.id, child_id)
            try:
                await node.start()
            except StartError as exc:
                raise exc.within(self.id) from None

    @staticmethod
    def _refuse_if_busy(node: Node) -> None:
        """OTP's ``{error, running}`` and ``{error, restarting}`` (a retry is pending)."""
        if node.alive:
            raise SupervisionError(f"running: {node.id} is running")
        if node.state == "restarting":
            raise SupervisionError(f"restarting: {node.id} is being restarted; "
                                   f"terminate_child stops the retries")

    async def delete_child(self, child_id: str) -> None:
        """Forget a direct child that is not running."""
        async with self._lock:
            node = self._child(child_id)
            self._refuse_if_busy(node)
            self.children.remove(node)
            log.info("supervisor %s: delete_child %s", self.id, child_id)

    async def start_child(self, spec: ChildSpec) -> Node:
        """Add a child after the others and start it; on failure it is not kept.  Children
        added this way are not in the spec, so a restart of this supervisor drops them (as
        OTP's; :meth:`change_spec` then :meth:`restart_child` adds one that stays)."""
        return await self._run_tracked(self._start_child(spec))

    async def _start_child(self, spec: ChildSpec) -> Node:
        async with self._lock:
            if self.state not in ("running", "restarting"):
                raise SupervisionError(f"supervisor {self.id} is {self.state}")
            for node in self.children:
                if node.id == spec.id:
                    what = "already_started" if node.alive else "already_present"
                    raise SupervisionError(f"{what}: {spec.id}")
            node = self._make_node(spec)
            self.children.append(node)
            try:
                await node.start()
            except StartError as exc:
                self.children.remove(node)
                raise exc.within(self.id) from None
            return node

    async def change_spec(self, spec: SupervisorSpec) -> list[str]:
        """OTP's ``code_change`` for a supervisor: take ``spec`` as this supervisor's new
        flags and children, at every depth, without starting or stopping anything.

        As OTP's ``update_childspec``: a running child keeps running under its new spec
        (used at its next start); a child new in ``spec`` is added after the others, not
        started (``restart_child`` starts it, as OTP's); a child no longer in ``spec`` is
        kept until ``terminate_child`` and ``delete_child`` remove it.  A nested
        supervisor takes its new spec the same way, so a restart of any supervisor of the
        subtree from now on builds the new shape (a restart rebuilds from the spec), which
        is what lets a resize survive a crash.  Returns the ids of the children added, at
        any depth, in start order.  A child that would change kind (worker/supervisor) is
        refused before anything changes.
        """
        self._check_change(spec)
        return await self._run_tracked(self._change_spec(spec))

    def _check_change(self, spec: SupervisorSpec) -> None:
        if not isinstance(spec, SupervisorSpec) or spec.id != self.id:
            raise SpecError(f"{self.id}: a new spec must be a SupervisorSpec with the same "
                            f"id, not {spec!r}")
        nodes = {n.id: n for n in self.children}
        for cs in spec.children:
            node = nodes.get(cs.id)
            if node is None:
                continue
            if node.kind != cs.type:
                raise SpecError(f"{self.id}/{cs.id}: a {node.kind} cannot become a {cs.type} "
                                f"while running")
            if isinstance(node, Supervisor):
                node._check_change(cs)  # type: ignore[arg-type]

    async def _change_spec(self, spec: SupervisorSpec) -> list[str]:
        async with self._lock:
            old_flags = (self.spec.max_restarts, self.spec.max_seconds)
            self.spec = spec
            if (spec.max_restarts, spec.max_seconds) != old_flags:
                self._intensity = RestartIntensity(spec.max_restarts, spec.max_seconds)
            nodes = {n.id: n for n in self.children}
            kids: list[Node] = []
            added: list[str] = []
            nested: list[str] = []
            for cs in spec.children:
                node = nodes.pop(cs.id, None)
                if node is None:
                    node = self._make_node(cs)
                    added.append(cs.id)
                elif isinstance(node, Supervisor):
                    nested += await node._change_spec(cs)  # type: ignore[arg-type]
                else:
                    node.spec = cs  # type: ignore[assignment]
                kids.append(node)
            # children no longer in the spec stay, last (stopped first), until deleted
            kids += [n for n in self.children if n.id in nodes]
            self.children = kids
        if added:
            log.info("supervisor %s: new spec; children added, not started: %s", self.id,
                     ", ".join(added))
        return added + nested

    # -- looking at the tree ----------------------------------------------------------------
    def find(self, child_id: str) -> Node | None:
        """The node with ``child_id`` at any depth (this supervisor included), or None."""
        if child_id == self.id:
            return self
        for node in self.children:
            hit = node.find(child_id)
            if hit is not None:
                return hit
        return None

    def walk(self, visit: Callable[[Node], None]) -> None:
        visit(self)
        for node in self.children:
            node.walk(visit)

    def snapshot(self) -> dict[str, Any]:
        """The status NODE of the interface contract, for this subtree."""
        return {"id": self.id, "kind": "supervisor", "strategy": self.spec.strategy.value,
                "pid": None, "state": self.state, "restarts": self.restarts,
                "children": [node.snapshot() for node in self.children]}
