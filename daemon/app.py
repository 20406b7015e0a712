"""The daemon: wires the supervision tree, the stages' hub, control and the drain.

One asyncio loop holds everything: the supervisors (objects, not processes), the hub that
stages report to, the operator's control socket, and the terminator — Broadway's process
that runs the graceful shutdown, here a coroutine of the daemon (``pid: null`` in status).

Reactions the daemon owns, because only it sees the whole pipeline:

* a stage downstream of the producers exits → every producer hands its in-flight messages
  back to its source (nothing lost; at-least-once); when a processor died unexpectedly,
  the producer that emitted the message it was running is told which one (its blame
  record), so a message that keeps killing processors is failed as poison after
  ``max_crashes`` instead of redelivered until the supervisors give up;
* a producer restarts → processors subscribe to it afresh;
* every producer idle under ``--until-idle``, SIGTERM/SIGINT, or ``offbroadway stop`` →
  the drain: producers stop fetching and flush, each stage flushes when all its producers
  have cancelled, batch processors report done, acks settle, then the tree stops in
  reverse start order.  Whatever is not done by ``shutdown_timeout`` stays unacked at the
  source, to be delivered again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import stat
import time
from typing import Any

from offbroadway.stages.flow import ratelimit
from offbroadway.stages.flow.ratelimit import SharedRateLimit
from offbroadway.stages.runtime import logs
from offbroadway.stages.runtime.spec import STAGE_ENV
from offbroadway.stages.wire import commands
from offbroadway.supervision import (
    ChildExited,
    Restarting,
    Supervisor,
)

from . import control, metrics, runlock, stopbudget, web
from . import outcome as outcome_mod
from . import reactions as reactions_mod
from . import reload as reload_mod
from . import resize as resize_mod
from . import status as status_mod
from . import topology as topo_mod
from .config import Config
from .hub import Hub
from .notify import Notifier
from .operator import Operator
from .poison import read_blame
from .resizer import Resizer
from .terminator import Phase, Terminator
from .timeline import Timeline

log = logging.getLogger("offbroadway.daemon")


class RuntimeDirError(RuntimeError):
    pass


def prepare_private_dir(path: str) -> None:
    """Create ``path`` 0700, or refuse one that others could write to (sockets live there)."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
    except OSError as exc:     # check says so first (config.preflight); a race lands here
        raise RuntimeDirError(f"runtime dir {path}: {exc.strerror or exc}") from None
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise RuntimeDirError(f"runtime dir {path} is writable by group/others "
                              f"(mode {stat.S_IMODE(st.st_mode):o}); refusing to start")
    if st.st_uid != os.getuid():
        raise RuntimeDirError(f"runtime dir {path} belongs to uid {st.st_uid}, not us")


#: how long a complete drain waits for the sources' books to show nothing owed (two of the
#: stages' report ticks)
SETTLE_GRACE = 2.5

#: what keeps a daemon from starting: one line for the operator, exit 1, nothing left behind
START_ERRORS = (RuntimeDirError, runlock.AlreadyRunning, metrics.ListenError)


def stop_budget(config: Config) -> float:
    """The longest a stop of ``config``'s pipeline can take (see :mod:`.stopbudget`)."""
    daemon = Daemon(config)
    daemon._build()
    return daemon.stop_budget


class Daemon:
    def __init__(self, config: Config, *, until_idle: bool = False,
                 notifier: Notifier | None = None) -> None:
        self.config = config
        #: the config file as last read (``config`` is the running one: a ``scale``
        #: changes it, not the file); a reload compares the file with this
        self.file_config = config
        self.until_idle = until_idle
        self.notifier = notifier or Notifier()
        #: the control socket's verbs (offbroadway status, stop, restart, drain...)
        self.operator = Operator(self)
        self._stop = asyncio.Event()
        self._idle_event = asyncio.Event()
        #: set whenever the terminator may have moved (the drain's waits wake on it)
        self._progress = asyncio.Event()
        self._housekeeping_task: asyncio.Future | None = None
        self._stop_deadline: float | None = None
        self.started_at = time.time()
        self.rate_limit: SharedRateLimit | None = None
        #: Ctrl-Cs (SIGINT) since the stop began: the third stops at once
        self._interrupts = 0
        self._abort = False
        #: "pipeline is up" is said once every producer's source is connected; until then
        #: "waiting for its source", once
        self._announced_up = False
        self._said_waiting = False
        #: carries out resizes (offbroadway scale, a reload's concurrency)
        self.resizer = Resizer(self)
        self._background: set[asyncio.Future] = set()
        #: restarts, crashes, reloads and operator verbs, for the live page (:mod:`.web`)
        self.timeline = Timeline()
        #: the books at the end of the last drain (:meth:`outcome`)
        self._outcome: outcome_mod.Outcome | None = None

    # -- wiring -----------------------------------------------------------------------------
    def _build(self) -> None:
        rt = self.config.runtime
        kwargs: dict[str, Any] = {}
        if self.config.spark is not None:
            from .spark import plan  # the Spark wiring; pyspark itself stays in the stages

            spark = plan(self.config.spark, runtime_dir=rt.dir, state_dir=rt.state_dir,
                         log_env=self._stage_env("spark"))
            kwargs.update(spark_child=spark.child, committer_env=spark.committer_env,
                          spark_settings=spark.settings)
        self._build_kwargs = kwargs
        self.topology = self.topology_of(self.config)
        self._spark_settings = kwargs.get("spark_settings")
        #: stage id -> its StageSpec payload after a reload (restarts use the new values)
        self.payloads: dict[str, str] = {}
        self.stop_budget = stopbudget.total(self.config.pipeline.shutdown_timeout,
                                            self.topology.root)
        self.reactions = reactions_mod.Reactions(
            self.topology, self.config.processors[topo_mod.PROCESSOR_KEY].max_crashes)
        self.terminator = Terminator(self.topology)
        self.board = status_mod.Board(self.topology)

    def topology_of(self, config: Config) -> topo_mod.Topology:
        """The tree of ``config``, wired as this daemon's (the one Spark server)."""
        return topo_mod.build(config, stage_env=self._stage_env, **self._build_kwargs)

    @property
    def stopping(self) -> bool:
        """A stop was asked for (SIGTERM, SIGINT, offbroadway stop)."""
        return self._stop.is_set()

    def _stage_env(self, stage_id: str) -> dict[str, str]:
        env = {logs.LEVEL_ENV: self.config.runtime.log_level,
               logs.FORMAT_ENV: self.config.runtime.log_format}
        payload = getattr(self, "payloads", {}).get(stage_id)
        if payload is not None:
            env[STAGE_ENV] = payload
        return env

    # -- reload -------------------------------------------------------------------------------
    async def reload(self, why: str = "reload") -> dict:
        """Re-read the config file; apply what may change live, or refuse it all (one line
        naming the key) and leave the pipeline untouched (:mod:`.reload`)."""
        answer = await self._reload(why)
        self.timeline.add("reload", why, answer.get("applied") or answer.get("error", ""))
        return answer

    async def _reload(self, why: str) -> dict:
        from .config import ConfigError, load_config

        try:
            from_file = load_config(self.config.path).config
            # a live `scale` outlives a reload that did not change that key in the file
            new = reload_mod.keep_live(self.file_config, from_file, self.config)
            changes = reload_mod.plan(self.config, new)
        except (ConfigError, reload_mod.ReloadRefused) as exc:
            log.error("%s refused: %s", why, exc)
            return {"ok": False, "error": f"reload refused: {exc}"}
        except OSError as exc:
            log.error("%s refused: cannot read %s: %s", why, self.config.path, exc)
            return {"ok": False, "error": f"reload refused: cannot read {self.config.path}: "
                                          f"{exc}"}
        resizes = resize_mod.requests(self.config, new)
        if resizes and (self.stopping or self.terminator.draining):
            log.error("%s refused: the pipeline is stopping", why)
            return {"ok": False, "error": "reload refused: the pipeline is stopping"}
        batchers: set[str] = set()
        for key, _old, value in changes.changes:
            if key.endswith(".concurrency"):
                continue              # a resize, below
            if key == "producer.rate_limit":
                assert self.rate_limit is not None
                self.rate_limit.set(value)
            elif key == "runtime.log_level":
                logging.getLogger().setLevel(value.upper())
                log.log(logging.getLevelName(value.upper()), "log level %s (%s)", value, why)
                self.send([reactions_mod.Send(sid, commands.LogLevel(value))
                            for sid in self.topology.stages])
            else:                     # batchers.<key>.batch_size / batch_timeout
                batchers.add(key.split(".")[1])
        self.send([reactions_mod.Send(topo_mod.batcher_id(key), commands.Batching(
            new.batchers[key].batch_size, new.batchers[key].batch_timeout))
            for key in sorted(batchers)])
        if resizes:
            # the new specs carry every reloaded value to the stages started from now on
            done = await self.resizer.resize(new, why)
            if not done["ok"]:
                return {"ok": False, "error": f"reload: {done['error']}"}
            self.file_config = from_file
        else:
            self.file_config = from_file
            self.config = new
            # stages restarted from now on start with the new values
            fresh = topo_mod.build(new, spark_settings=self._spark_settings)
            self.payloads = {w.id: w.env()[STAGE_ENV] for w in _workers(fresh.root)}
        log.info("%s: %s", why, changes.describe())
        return {"ok": True, "applied": changes.describe()}

    def _on_sighup(self) -> None:
        task = asyncio.ensure_future(self.reload("SIGHUP reload"))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def on_report(self, stage_id: str, report: commands.Report) -> None:
        """A stage's report: its figures for status and the totals, and the terminator's
        inputs."""
        if isinstance(report, (commands.Stats, commands.Done, commands.Settled,
                               commands.Left)) and \
                "pid" in report.stats:
            self.board.record(stage_id, report.stats)
        t = self.terminator
        if isinstance(report, commands.Idle):
            if t.idle_report(stage_id, report.idle) and self.until_idle:
                self._idle_event.set()
        elif isinstance(report, commands.Done):
            t.report_done(stage_id)
            self._progress.set()
        elif isinstance(report, commands.Settled):
            t.report_settled(stage_id)
            self._progress.set()
        elif isinstance(report, commands.Hello):
            self.send(t.hello(stage_id))
        elif isinstance(report, commands.Left) and self.resizer.report_left(stage_id):
            self.reactions.left(stage_id)
            self._progress.set()

    def on_event(self, event: object) -> None:
        """Supervision events: the pure reactions (:mod:`.reactions`) decide, this sends."""
        record = None
        self.timeline.supervision(event)
        if isinstance(event, ChildExited):
            if self.metrics_server is not None:
                metrics.process_dead(event.pid, self.metrics_dir)
            self.terminator.exited(event.child_id)
            if event.child_id in self.reactions.blamed:
                record = read_blame(self.config.runtime.dir, event)
        # asked before the reactions forget what the cascade lost
        handed_back = isinstance(event, Restarting) and self.reactions.hands_back(
            event.children)
        sends = self.reactions.on_event(event, record)
        if handed_back and self.terminator.draining:
            # what the dead stages held went back to the source (requeued by the live
            # producers, or taken back by restarting ones: a Spark server's restart takes
            # every producer along): the drain cannot end with every message acked; it
            # stops waiting (see _run_again)
            self.terminator.requeued()
            self._progress.set()
        self.send(sends)

    def send(self, sends: list[reactions_mod.Send]) -> None:
        for s in sends:
            if not self.hub.send(s.stage, s.command):
                # the stage is not connected to the hub: it is down or starting.  A requeue
                # or release then has nothing to do (a restarting producer's source takes
                # back what it had in flight, and it starts with nothing held); a
                # restarting consumer subscribes on its own, and a stage starting during
                # the drain is brought into it by its hello.  Said, not dropped silently.
                log.warning("%s not connected: command %s not delivered (%s)", s.stage,
                            s.command.NAME, getattr(s.command, "reason", "") or
                            "it is brought up to date when it says hello")

    # -- run --------------------------------------------------------------------------------
    async def run(self) -> int:
        rt = self.config.runtime
        prepare_private_dir(rt.dir)
        lock = runlock.acquire(rt.dir)   # first: a second daemon on this dir touches nothing
        try:
            return await self._run()
        finally:
            lock.release()

    def _serve_metrics(self) -> None:
        """Bind /metrics before anything else listens: a port in use leaves nothing behind."""
        self.metrics_dir = os.path.join(self.config.runtime.dir, "metrics")
        metrics.prepare_dir(self.metrics_dir)   # before any stage starts
        try:
            # the HTTP thread reads a copy refreshed on the loop, never the live tree
            self.metrics_server = metrics.serve(self.config.metrics.listen, self.metrics_dir,
                                                self.config.pipeline.name, lambda: self.tree_copy,
                                                rate_limit=self.rate_bucket,
                                                wrap=lambda app: web.Page(self, self.timeline, app))
        except metrics.ListenError:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)
            raise

    def rate_bucket(self) -> ratelimit.Bucket:
        """The shared rate limit as /metrics reads it (off until the daemon made it)."""
        return self.rate_limit.read() if self.rate_limit is not None else ratelimit.Bucket()

    async def _run(self) -> int:
        rt = self.config.runtime
        os.makedirs(rt.state_dir, mode=0o700, exist_ok=True)
        self._build()
        self.metrics_server = None
        self.root = Supervisor(self.topology.root, on_event=self.on_event)
        self.tree_copy: dict = self.root.snapshot()
        if self.config.metrics.listen:
            self._serve_metrics()
        # before any producer starts: each maps it at setup
        self.rate_limit = SharedRateLimit.create(rt.dir, self.config.producer.rate_limit)
        self.hub = Hub(rt.dir, self.on_report)
        self.hub.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop, sig.name)
        loop.add_signal_handler(signal.SIGHUP, self._on_sighup)
        name = self.config.pipeline.name
        self.control = await control.serve(os.path.join(rt.dir, control.CONTROL_SOCKET),
                                           self.operator.handle)
        try:
            self.notifier.status(f"starting pipeline {name}")
            if not await self._start_unless_stopped():
                return 0 if self._stop.is_set() else 1
            self._announce_up()
            self.notifier.ready(f"pipeline {name} running")
            self._housekeeping_task = asyncio.ensure_future(self._housekeeping())
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
                    log.info("pipeline %s: source exhausted; draining (what is in flight is "
                             "written and acked first)", name)
                await self.drain()
                if self._stop.is_set() or not self.until_idle:
                    return 0   # a stop: what is not done stays unacked, delivered again
                if self.terminator.phase is Phase.REQUEUED:
                    await self._run_again()
                    continue
                if self.terminator.phase is Phase.EXPIRED:
                    # --until-idle promises every message written and acked: say that it
                    # was not, and exit non-zero (nothing is lost: the source keeps them)
                    log.error("pipeline %s: --until-idle: the drain did not finish within "
                              "shutdown_timeout %gs; what was in flight stays unacked at the "
                              "source and is delivered again at the next run; exiting 1",
                              name, self.config.pipeline.shutdown_timeout)
                    self.notifier.status("drain incomplete")
                    return outcome_mod.EXIT_UNACKED
                assert self._outcome is not None   # drain() took the books
                return self._until_idle_exit(self._outcome)
        finally:
            self.notifier.stopping()
            self._announce_stop()
            await self._stop_tree()
            if self._housekeeping_task is not None:
                self._housekeeping_task.cancel()
            self.timeline.close()         # the page's open streams end
            if self.metrics_server is not None:
                self.metrics_server.shutdown()
            self.control.close()
            self.hub.close()
            self._remove_sockets()
            if self.rate_limit is not None:
                self.rate_limit.remove()
            log.info("pipeline %s stopped", name)

    async def _run_again(self) -> None:
        """``--until-idle`` promises an exit once every message is written and acked.  A
        stage that died during the drain had its messages requeued at the source, where the
        drained producers would leave them: the pipeline (producers and all after them; a
        Spark server stays) is restarted out of the drain and runs until idle again."""
        log.warning("pipeline %s: a stage died during the drain and its messages went back "
                    "to the source; running again until idle, so that every message is "
                    "written and acked before exiting", self.config.pipeline.name)
        drained = self.terminator.reset()
        self._idle_event.clear()
        if drained:
            # stages still in drain mode would leave the requeued messages at the source
            first = self.topology.root.children[1 if self.topology.spark else 0].id
            await self.root.restart_subtree_or_child(first)
        # else every drained stage is gone (a Spark server's restart takes the whole
        # pipeline along): their successors start undrained, no second restart needed
        self.notifier.status("running (again after a crash during the drain)")

    async def _start_unless_stopped(self) -> bool:
        """Start the tree; a stop asked for meanwhile (a Spark server takes seconds to come
        up) stops what has started instead of first bringing the whole pipeline up."""
        name = self.config.pipeline.name
        window = self.topology.window
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
        if self._announced_up or self.terminator.draining:
            return
        name = self.config.pipeline.name
        reported = self.board.all_reported()
        down = self.board.sources_down()
        if reported and not down:
            self._announced_up = True
            log.info("pipeline %s is up: %d stages", name, len(self.topology.stages))
            if self._said_waiting:
                self.notifier.status(f"pipeline {name} running")
        elif down and not self._said_waiting:
            self._said_waiting = True
            log.warning("pipeline %s: %d stages started, not up: waiting for its source "
                        "(%s)", name, len(self.topology.stages), "; ".join(down))
            self.notifier.status(f"pipeline {name} waiting for its source")

    def _remove_sockets(self) -> None:
        """A clean exit leaves no socket behind (every stage is stopped by now)."""
        from .config import socket_paths

        for path in socket_paths(self.config):
            try:
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    os.unlink(path)
            except OSError:
                pass

    async def _housekeeping(self) -> None:
        """Once a second: systemd's watchdog ping and the tree copy /metrics reads."""
        interval = min(1.0, self.notifier.watchdog_interval() or 1.0)
        while True:
            self.tree_copy = self.root.snapshot()
            self.notifier.watchdog()
            self._announce_up()
            await asyncio.sleep(interval)

    def _announce_stop(self) -> None:
        """Tell systemd once, in full, how long this stop may take (the stop budget)."""
        if self._stop_deadline is None:
            self._stop_deadline = time.monotonic() + self.stop_budget
            self.notifier.extend_timeout(self.stop_budget)

    async def _stop_tree(self) -> None:
        """Stop the tree within what is left of the budget; past it, SIGKILL the rest."""
        assert self._stop_deadline is not None
        left = self._stop_deadline - time.monotonic() - stopbudget.MARGIN
        try:
            await asyncio.wait_for(asyncio.shield(self.root.stop()), max(left, 0.1))
        except TimeoutError:
            log.error("stop budget of %.0fs spent: SIGKILL to every stage still running",
                      self.stop_budget)
            self.root.kill_now()
            await self.root.stop()

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
        elif not self._abort:
            log.warning("%s received a third time: stopping now; messages in flight stay "
                        "unacked at the source and are delivered again", why)
            self._abort = True
            self._progress.set()

    # -- the terminator ---------------------------------------------------------------------
    async def drain(self) -> None:
        """Broadway's shutdown cascade (:mod:`.terminator`), bounded by
        ``pipeline.shutdown_timeout``."""
        timeout = self.config.pipeline.shutdown_timeout
        deadline = time.monotonic() + timeout
        self.notifier.stopping()
        self._announce_stop()
        self.notifier.status("draining")
        t = self.terminator
        began = time.monotonic()
        self.send(t.begin())
        if not await self.wait_for(lambda: t.ended, deadline):
            # the deadline, or a third Ctrl-C: say which, and after how long it really was
            why = ("stopped at once (third Ctrl-C)" if self._abort else
                   f"shutdown_timeout {timeout:g}s passed")
            for line in t.expire():
                log.warning("drain: %s after %.1fs: %s", why, time.monotonic() - began, line)
        if t.phase is Phase.REQUEUED and self.until_idle and not self._stop.is_set():
            return   # not complete: run again (see _run_again)
        log.info("drain complete" if t.phase is Phase.COMPLETE else
                 "drain cut short by a third Ctrl-C" if self._abort else
                 "drain ended at shutdown_timeout")
        if t.phase is Phase.COMPLETE and self.until_idle:
            # the exit code reads the books.  A source that settles through an I/O thread
            # of its own (NATS) can still count its last acks as owed in the report that
            # said "settled": its next report, within a tick, has them
            await self.wait_for(lambda: not self.outcome().unacked,
                                time.monotonic() + SETTLE_GRACE)
        for p in self.topology.producers:
            # the books of each source as its producer last reported them (the settled
            # report when it settled): what an operator checks after a stop
            src = self.board.source(p)
            if src:
                log.info("%s: source %s fetched %s, acked %s, failed %s, unacked %s", p,
                         src.get("source"), src.get("fetched"), src.get("acked"),
                         src.get("failed"), src.get("unacked"))
        self._outcome = self.outcome()
        for line in self._outcome.lines():
            print(line, flush=True)

    def outcome(self) -> outcome_mod.Outcome:
        """The run's books as the stages last reported them (:mod:`.outcome`): rows
        committed per Spark batcher (those a resize or a restart removed too), messages
        acked and failed, and what the sources still owe."""
        t, board = self.topology, self.board
        written = []
        spark = self.config.spark
        if spark is not None:
            stages = board.totals.stages()
            for key in self.config.batchers:
                # every batch processor that ever reported, those a resize removed too
                bps = [s for s in stages if topo_mod.role_of(s) == topo_mod.BATCH_PROCESSOR
                       and topo_mod.key_of(s) == key]
                committer = [topo_mod.committer_id(key)]
                written.append(outcome_mod.Written(
                    key, board.sum(committer, "out"), board.sum(bps, "out"),
                    board.sum(committer, "already_written")))
        failed = board.sum(t.producers, "failed")
        retried = sum(int(board.source(p).get("failure_requeued",
                                               board.source(p).get("naked", 0)) or 0)
                      for p in t.producers)
        return outcome_mod.Outcome(
            self.config.pipeline.name, acked=board.sum(t.producers, "acked"), failed=failed,
            unacked=sum(int(board.source(p).get("unacked") or 0) for p in t.producers),
            failed_to=board.failed_to() if failed else "", failures_retried=retried,
            written=written,
            output=spark.output if spark is not None else "",
            table=spark.table if spark is not None else "",
            fmt=spark.format if spark is not None else "")

    def _until_idle_exit(self, books: outcome_mod.Outcome) -> int:
        """``--until-idle`` after a complete drain: the exit code the books call for."""
        code, line = books.until_idle_exit()
        if line:
            log.error("pipeline %s: %s", self.config.pipeline.name, line)
            self.notifier.status("messages left unacked" if code == outcome_mod.EXIT_UNACKED
                                 else "some messages failed")
        return code

    async def wait_for(self, predicate, deadline: float) -> bool:
        while not predicate():
            if self._abort:
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._progress.clear()
            try:
                await asyncio.wait_for(self._progress.wait(), min(remaining, 0.5))
            except TimeoutError:
                pass
        return True

    def status(self) -> dict:
        """``{"pipeline": NAME, "tree": NODE}`` per the interface contract (§10), and the
        daemon's own figures (:mod:`.status`)."""
        draining = self.terminator.draining
        tree = self.board.tree(self.root.snapshot(), "draining" if draining else "running")
        producers = self.topology.producers
        return {"pipeline": self.config.pipeline.name, "tree": tree,
                "draining": draining, "paused": self.operator.paused,
                "rate_limit": ratelimit.describe(self.rate_bucket()),
                "stopping": self._stop.is_set(), "pid": os.getpid(),
                "uptime": time.time() - self.started_at,
                "acked": self.board.sum(producers, "acked"),
                "failed": self.board.sum(producers, "failed"),
                "failed_to": self.board.failed_to(),
                "sources_down": self.board.sources_down(),
                # a resize under way: the stages it removes that are finishing what they hold
                "leaving": self.resizer.still_leaving()}


def _workers(node: Any) -> list:
    """The worker specs of a supervision tree, depth first."""
    children = getattr(node, "children", None)
    if children is None:
        return [node]
    return [w for c in children for w in _workers(c)]
