"""The daemon's shell: its directories and lock, the hub, the signals and the loop.

One asyncio loop holds everything: the supervisors (objects, not processes), the hub that
stages report to, the operator's control socket (:mod:`.operator`) and the drain
(:mod:`.drainer`), Broadway's terminator run as a coroutine of the daemon (``pid: null``
in status).  What the pipeline is and what a report or a supervision event calls for is
the running pipeline's state (:mod:`..core.pipeline`: the reactions of :mod:`..core.reactions`, the
terminator, the board); this module delivers what it decides, with the I/O it needs
(the blame records, the metrics dir, the hub), and runs the pipeline until a stop, a
give-up or, under ``--until-idle``, the end of the source.

Its parts (the lock, /metrics, the rate limit, the hub, the control socket, the tree...)
are :class:`~.steps.Step` s, each naming what it requires: they start in that order and
stop in reverse, and a part that failed to start is not stopped (:meth:`Daemon.steps`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import signal
import stat
import time
from collections.abc import Awaitable, Callable
from typing import Any

from offbroadway.stages.flow import ratelimit
from offbroadway.stages.flow.ratelimit import SharedRateLimit
from offbroadway.stages.poison import books as poison_books
from offbroadway.stages.runtime import redact, tally
from offbroadway.stages.runtime.metrics import counter_for
from offbroadway.stages.wire import commands
from offbroadway.supervision import ChildExited, Supervisor

from ..config.names import role_of
from ..config.records import CONTROL_SOCKET, Config
from ..core.pipeline import Effects, PipelineState, TreeHandle
from ..core.poison import read_blame
from ..core.reactions import Send
from ..core.terminator import Phase
from ..observe import metrics, usage, web
from ..observe.timeline import Timeline
from ..spark.wiring import Wiring
from . import control_server, reloader, runlock
from .drainer import Drainer
from .hub import Hub
from .notify import Notifier
from .operator import Operator
from .resizer import Resizer
from .steps import Step, Steps

log = logging.getLogger("offbroadway.daemon")


#: what keeps a daemon from starting: one line for the operator, exit 1, nothing left behind
START_ERRORS = (runlock.RuntimeDirError, runlock.AlreadyRunning, metrics.ListenError)


def config_secrets(config: Config) -> list[str]:
    """Every secret in ``config``: the passwords of its URLs and the values of its options
    named like secrets (a source's, the Spark section's, the handler's context)."""
    try:
        tree = dataclasses.asdict(config)
    except TypeError:
        tree = vars(config)
    return redact.value_secrets(tree)


def unpublished_metrics(stage_id: str, words: tally.LastWords | None,
                        own_books: bool) -> dict[str, float]:
    """A dead stage's counts its metrics never published, by sample name.  ``own_books``:
    the stage is a producer whose source counts failed messages itself (its ``failed``
    metric is the source's, not the stage counter's)."""
    role = role_of(stage_id)
    if words is None or role is None:
        return {}
    out: dict[str, float] = {}
    for key, delta in words.unpublished().items():
        metric = counter_for(role, key)
        if metric is not None and not (own_books and key == "failed"):
            out[metric[0]] = delta
    return out


class Daemon:
    def __init__(self, config: Config, *, until_idle: bool = False,
                 notifier: Notifier | None = None) -> None:
        #: the running pipeline: config, topology, reactions, terminator, board, budget
        self.state = PipelineState(config, Wiring(config))
        self.until_idle = until_idle
        self.notifier = notifier or Notifier()
        self._stop = asyncio.Event()
        self._idle_event = asyncio.Event()
        self._housekeeping_task: asyncio.Future | None = None
        self.started_at = time.time()
        self.rate_limit: SharedRateLimit | None = None
        #: Ctrl-Cs (SIGINT) since the stop began: the third stops at once
        self._interrupts = 0
        #: "pipeline is up" is said once every producer's source is connected; until then
        #: "waiting for its source", once
        self._announced_up = False
        self._said_waiting = False
        self._background: set[asyncio.Future] = set()
        #: restarts, crashes, reloads and operator verbs, for the live page (:mod:`..observe.web`)
        self.timeline = Timeline()
        rt = config.runtime
        #: the root supervisor: objects until the tree step starts it
        self.root = Supervisor(self.state.topology.root, on_event=self.on_event)
        self.tree = TreeHandle(self.root)
        self.drainer = Drainer(self.state, self.tree, self.notifier, self.send,
                               self._stop.is_set, self.until_idle, self._landed_acks)
        #: carries out resizes (offbroadway scale, a reload's concurrency)
        self.resizer = Resizer(self.state, self.tree, self)
        #: the control socket's verbs (offbroadway status, stop, restart, drain...)
        self.operator = Operator(self.state, self.tree, self, self.resizer)
        # -- what the steps make (None until their start)
        self._lock: runlock.RunLock | None = None
        self.metrics_dir = os.path.join(rt.dir, "metrics")
        self.metrics_server: Any = None
        self.hub: Hub | None = None
        self.control: Any = None          # the control socket's server
        #: the tree came up: set once the pipeline is running (housekeeping waits for it)
        self._running = asyncio.Event()
        #: whether the tree step's start brought the pipeline up
        self._tree_up = False
        self.steps = Steps(self._steps())

    @property
    def config(self) -> Config:
        """The running config (a ``scale`` or a reload changes it)."""
        return self.state.config

    @property
    def stopping(self) -> bool:
        """A stop was asked for (SIGTERM, SIGINT, offbroadway stop)."""
        return self._stop.is_set()

    async def reload(self, why: str = "reload") -> dict:
        """Re-read the config file and apply it (:mod:`.reloader`); on the timeline."""
        answer = await reloader.reload(self.state, self.tree, self, self.resizer, why)
        self.timeline.add("reload", why, answer.get("applied") or answer.get("error", ""))
        return answer

    def _on_sighup(self) -> None:
        task = asyncio.ensure_future(self.reload("SIGHUP reload"))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def on_report(self, stage_id: str, report: commands.Report) -> None:
        """A stage's report: the state takes it (:meth:`PipelineState.report`)."""
        self._effects(self.state.report(stage_id, report))

    def on_event(self, event: object) -> None:
        """Supervision events: the state decides (:meth:`PipelineState.supervision`); the
        shell reads the blame record, marks the dead's metrics and sends."""
        record = None
        self.timeline.supervision(event)
        if isinstance(event, ChildExited):
            # the counts since its last report and its last metrics flush, which a SIGKILL
            # kept it from sending (its tally, :mod:`offbroadway.stages.runtime.tally`)
            words = tally.take(tally.path(self.config.runtime.dir, event.child_id), event.pid)
            own_books = "failures" in self.state.board.source(event.child_id)
            notes = tally.take_notes(tally.notes_path(self.config.runtime.dir,
                                                      event.child_id), event.pid)
            if notes:
                self._effects(self.state.last_notes(event.child_id, notes))
            if words is not None:
                self.state.board.last_words(event.child_id, event.pid, words.counts)
                if words.doubt is not None:
                    self.state.last_doubt(event.child_id, words.doubt.when,
                                          words.doubt.digests)
                    log.info("%s: killed while an ack frame of %d message(s) was leaving: "
                             "whether the broker got it, their redelivery will say (acks "
                             "in doubt until then)", event.child_id,
                             len(words.doubt.digests))
            if self.metrics_server is not None:
                metrics.process_dead(event.pid, self.metrics_dir,
                                     unpublished_metrics(event.child_id, words, own_books))
            if event.child_id in self.state.reactions.blamed:
                record = read_blame(self.config.runtime.dir, event)
        self._effects(self.state.supervision(event, record))

    def _landed_acks(self, producer: str, acks: int) -> None:
        """A killed producer's acks in doubt that landed: its dead incarnations' counter."""
        if self.metrics_server is not None:
            metrics.landed(self.metrics_dir, producer, acks)

    def _effects(self, effects: Effects) -> None:
        if effects.idle and self.until_idle:
            self._idle_event.set()
        if effects.progress:
            self.drainer.progress.set()
        self.send(effects.sends)

    def send(self, sends: list[Send]) -> None:
        for s in sends:
            if not self.hub.send(s.stage, s.command) and \
                    not isinstance(s.command, commands.Reconcile):
                # (a producer gone has no books to reconcile: the daemon's are the truth)
                # the stage is not connected to the hub: it is down or starting.  A requeue
                # or release then has nothing to do (a restarting producer's source takes
                # back what it had in flight, and it starts with nothing held); a
                # restarting consumer subscribes on its own, and a stage starting during
                # the drain is brought into it by its hello.  Said, not dropped silently.
                log.warning("%s not connected: command %s not delivered (%s)", s.stage,
                            s.command.NAME, getattr(s.command, "reason", "") or
                            "it is brought up to date when it says hello")

    # -- the parts, started in order and stopped in reverse ---------------------------------
    def _steps(self) -> list[Step]:
        """The daemon's parts, declared in start order; each names what it requires."""
        return [
            # first: a second daemon on this dir touches nothing
            Step("lock", self._take_lock, self._release_lock),
            Step("dirs", self._prepare_dirs, requires=("lock",)),
            # /metrics binds before anything else listens: a port in use leaves nothing
            Step("metrics", self._serve_metrics, self._stop_metrics, requires=("lock",)),
            # before any producer starts: each maps it at setup
            Step("rate_limit", self._create_rate_limit, self._remove_rate_limit,
                 requires=("lock",)),
            # the sockets are removed once what binds them is closed (the stages' too)
            Step("sockets", stop=self._remove_sockets, requires=("lock",)),
            Step("hub", self._start_hub, self._close_hub, requires=("sockets",)),
            Step("signals", self._handle_signals),
            Step("control", self._serve_control, self._close_control,
                 requires=("sockets", "signals")),
            # the watchdog keeps being told through the tree's whole stop
            Step("housekeeping", self._start_housekeeping, self._stop_housekeeping),
            Step("tree", self._start_tree, self._stop_tree,
                 requires=("dirs", "metrics", "rate_limit", "hub", "control", "housekeeping")),
        ]

    def _take_lock(self) -> None:
        rt = self.config.runtime
        runlock.prepare_private_dir(rt.dir)
        self._lock = runlock.acquire(rt.dir)

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.release()

    def _prepare_dirs(self) -> None:
        rt = self.config.runtime
        os.makedirs(rt.state_dir, mode=0o700, exist_ok=True)
        # poison strikes outlive a producer's restart, not the daemon's run
        poison_books.clear(rt.dir)

    def _serve_metrics(self) -> None:
        """Bind /metrics before anything else listens: a port in use leaves nothing behind."""
        if not self.config.metrics.listen:
            return
        metrics.prepare_dir(self.metrics_dir)   # before any stage starts
        try:
            # the HTTP thread reads a copy refreshed on the loop, never the live tree
            self.metrics_server = metrics.serve(self.config.metrics.listen, self.metrics_dir,
                                                self.config.pipeline.name, lambda: self.tree.copy,
                                                rate_limit=self.rate_bucket,
                                                wrap=lambda app: web.Page(
                                                    self.status, self.state, self.timeline, app))
        except metrics.ListenError:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)
            raise

    def _stop_metrics(self) -> None:
        self.timeline.close()         # the page's open streams end
        if self.metrics_server is not None:
            self.metrics_server.shutdown()

    def _create_rate_limit(self) -> None:
        self.rate_limit = SharedRateLimit.create(self.config.runtime.dir,
                                                 self.config.producer.rate_limit)

    def _remove_rate_limit(self) -> None:
        if self.rate_limit is not None:
            self.rate_limit.remove()

    def _start_hub(self) -> None:
        self.hub = Hub(self.config.runtime.dir, self.on_report)
        self.hub.start()

    def _close_hub(self) -> None:
        if self.hub is not None:
            self.hub.close()

    def _handle_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop, sig.name)
        loop.add_signal_handler(signal.SIGHUP, self._on_sighup)

    async def _serve_control(self) -> None:
        self.control = await control_server.serve(
            os.path.join(self.config.runtime.dir, CONTROL_SOCKET), self.operator.handle)

    def _close_control(self) -> None:
        if self.control is not None:
            self.control.close()

    def _start_housekeeping(self) -> None:
        self._housekeeping_task = asyncio.ensure_future(self._housekeeping())

    def _stop_housekeeping(self) -> None:
        if self._housekeeping_task is not None:
            self._housekeeping_task.cancel()

    async def _start_tree(self) -> None:
        """Start the supervision tree (unless a stop comes first); it counts as started
        either way, so that its stop always runs (:meth:`_stop_tree`)."""
        self.notifier.status(f"starting pipeline {self.config.pipeline.name}")
        self._tree_up = await self._start_unless_stopped()

    async def _stop_tree(self) -> None:
        self.notifier.stopping()
        self.drainer.announce_stop()
        await self.drainer.stop_tree(self.root)
        self._clear_staging()
        self._mark_journals_clean()

    def rate_bucket(self) -> ratelimit.Bucket:
        """The shared rate limit as /metrics reads it (off until the daemon made it)."""
        return self.rate_limit.read() if self.rate_limit is not None else ratelimit.Bucket()

    # -- run --------------------------------------------------------------------------------
    async def run(self) -> int:
        # the last line of defence: a secret of the config that a message quotes anyway
        # (a client library's error, a handler's) is masked on every log line
        redact.install_filter(config_secrets(self.config))
        name = self.config.pipeline.name
        try:
            await self.steps.start()
            return await self._run()
        finally:
            tree_started = "tree" in self.steps.started
            await self.steps.stop()
            if tree_started:
                log.info("pipeline %s stopped", name)

    async def _run(self) -> int:
        """The pipeline from its start to a stop, a give-up or (``--until-idle``) its end;
        every part is up (the tree started, or failed to: then the exit code says so)."""
        name = self.config.pipeline.name
        if not self._tree_up:
            return 0 if self._stop.is_set() else 1
        self._announce_up()
        self.notifier.ready(f"pipeline {name} running")
        self._running.set()
        while True:
            waits = {asyncio.ensure_future(self._stop.wait()): "stop",
                     asyncio.ensure_future(self.root.wait_failed()): "failed"}
            if self.until_idle:
                waits[asyncio.ensure_future(self._idle_event.wait())] = "idle"
            finished, pending = await asyncio.wait(waits,
                                                   return_when=asyncio.FIRST_COMPLETED)
            for fut in pending:
                fut.cancel()
            first = next(iter(finished))
            if waits[first] == "failed":
                reason = first.result()
                log.error("pipeline %s gave up: %s", name, reason)
                self.notifier.status(f"failed: {reason}")
                return 1
            if waits[first] == "idle":
                if not self.state.terminator.all_idle:
                    # a source died since it said idle: what it had in flight is back at
                    # the source, and its successor reads it before the drain may begin
                    self._idle_event.clear()
                    continue
                log.info("pipeline %s: source exhausted; draining (what is in flight is "
                         "written and acked first)", name)
            await self.drainer.drain()
            if self._stop.is_set() or not self.until_idle:
                return 0   # a stop: what is not done stays unacked, delivered again
            if self.state.terminator.phase is Phase.REQUEUED:
                self._idle_event.clear()
                await self.drainer.run_again()
                continue
            return self.drainer.until_idle_exit()

    def _clear_staging(self) -> None:
        """Every stage has stopped: the staged batches are read by nobody now."""
        spark = self.config.spark
        if spark is not None:
            from ..spark.wiring import clear_staging

            n = clear_staging(spark, self.config.runtime.state_dir, list(self.config.batchers))
            if n:
                log.debug("removed %d staged batch file(s)", n)

    def _mark_journals_clean(self) -> None:
        """Every stage has stopped after a drain whose books leave nothing to come back:
        no message unacked or failed back into its queue, every committed row answered to
        its batch processor.  No message of the last commits is delivered again, so the
        committers' journals say so, and the next start puts nothing in doubt (nor says
        it does).  Anything less, and the next start reads the last commits back."""
        spark, out = self.config.spark, self.drainer.outcome
        if spark is None or out is None or self.state.terminator.phase is Phase.EXPIRED:
            return
        if out.unacked or out.stay or any(w.unanswered for w in out.written):
            return
        from ..spark.wiring import mark_journals_clean

        runtime = self.config.runtime
        try:
            mark_journals_clean(spark, runtime.state_dir or runtime.dir,
                                self.config.pipeline.name, list(self.config.batchers))
        except OSError as exc:   # the next start reads the last commits back: safe
            log.warning("could not mark the Spark commit journals clean: %s", exc)

    async def _start_unless_stopped(self) -> bool:
        """Start the tree; a stop asked for meanwhile (a Spark server takes seconds to come
        up) stops what has started instead of first bringing the whole pipeline up."""
        name = self.config.pipeline.name
        window = self.state.topology.window
        if window is not None and window.note:
            log.log(logging.WARNING if window.waits else logging.INFO, "pipeline %s: %s",
                    name, window.note)
        start = asyncio.ensure_future(self.root.start())
        stop = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait({start, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not start.done():
            log.info("pipeline %s: stop requested while starting; stopping what has started",
                     name)
            await self.root.stop()       # cancels the start
            await asyncio.gather(start, return_exceptions=True)
            return False
        stop.cancel()
        try:
            start.result()
        except Exception as exc:
            if self._stop.is_set():
                return False
            log.error("pipeline %s failed to start: %s", name, exc)
            return False
        return True

    def _announce_up(self) -> None:
        """Say the pipeline is up only once its sources are connected; until then, say what
        it waits for (the sources log each retry themselves)."""
        if self._announced_up or self.state.terminator.draining:
            return
        name = self.config.pipeline.name
        reported = self.state.board.all_reported()
        down = self.state.board.sources_down()
        if reported and not down:
            self._announced_up = True
            log.info("pipeline %s is up: %d stages", name, len(self.state.topology.stages))
            if self._said_waiting:
                self.notifier.status(f"pipeline {name} running")
        elif down and not self._said_waiting:
            self._said_waiting = True
            log.warning("pipeline %s: %d stages started, not up: waiting for its source "
                        "(%s)", name, len(self.state.topology.stages), "; ".join(down))
            self.notifier.status(f"pipeline {name} waiting for its source")

    def _remove_sockets(self) -> None:
        """A clean exit leaves no socket behind (every stage is stopped by now)."""
        from ..config.records import socket_paths

        for path in socket_paths(self.config):
            try:
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    os.unlink(path)
            except OSError:
                pass

    async def _housekeeping(self) -> None:
        """Once a second from the pipeline's READY on: systemd's watchdog ping and the
        tree copy /metrics reads."""
        await self._running.wait()
        interval = min(1.0, self.notifier.watchdog_interval() or 1.0)
        while True:
            self.tree.refresh()
            self.notifier.watchdog()
            self._announce_up()
            await asyncio.sleep(interval)

    def request_stop(self, why: str = "stop") -> None:
        """First request: drain.  Later ones say what is going on; a third Ctrl-C (SIGINT:
        someone at a terminal) stops now, without waiting for what is in flight (it stays
        unacked at the source and is delivered again).  A repeated SIGTERM or ``stop``
        never cuts the drain short: that is for a human who decided to."""
        if not self._stop.is_set():
            log.info("%s received: draining", why)
            self._stop.set()
            if why == "SIGINT":
                self._interrupts = 1
            return
        if why != "SIGINT":
            log.info("%s received: already stopping (the drain finishes what is in flight, "
                     "up to shutdown_timeout %gs)", why, self.config.pipeline.shutdown_timeout)
            return
        self._interrupts += 1
        if self._interrupts < 3:
            log.warning("%s received again: already stopping (draining finishes what is in "
                        "flight, up to shutdown_timeout %gs); %s more stops at once",
                        why, self.config.pipeline.shutdown_timeout,
                        "once" if self._interrupts == 2 else "twice")
        elif not self.drainer.abort:
            log.warning("%s received a third time: stopping now; messages in flight stay "
                        "unacked at the source and are delivered again", why)
            self.drainer.cut_short()

    def wait_for(self, predicate: Callable[[], bool], deadline: float) -> Awaitable[bool]:
        """Until ``predicate()``, the deadline or a third Ctrl-C (:meth:`Drainer.wait_for`)."""
        return self.drainer.wait_for(predicate, deadline)

    def status(self) -> dict:
        """What ``offbroadway status`` answers (:meth:`PipelineState.status`), each
        process's memory and CPU added (:func:`..observe.usage.annotate`)."""
        answer = self.state.status(
            self.root.snapshot(), paused=self.operator.paused,
            rate_limit=ratelimit.describe(self.rate_bucket()), stopping=self._stop.is_set(),
            pid=os.getpid(), uptime=time.time() - self.started_at)
        usage.annotate(answer["tree"], self.state.topology.spark)
        return answer
