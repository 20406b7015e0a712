"""The chaos run's driver: a config, a source filled with N messages, the daemon started,
stages SIGKILLed on the kill plan (:mod:`chaos_plan`), the source drained and the books
(:mod:`chaos_books`) checked.  :func:`run_chaos` returns the report; the steps and the
checks are described in bench/chaos.py's module doc."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
from benchlib import wait_alive
from chaos_books import classify_exits, compare_restarts, gave_up, output_check, restarts_of
from chaos_plan import (
    KINDS,
    Kill,
    KillBudget,
    LoadWindow,
    all_running,
    eligible,
    expected_restarts,
    kind_of,
    spec_tree,
    unseen_kills,
)
from offbroadway.supervision.tree import snapshot_nodes, workers_under

REPO = Path(__file__).resolve().parent.parent
AMQP_URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
BATCHER = "spark"


#: The handler every stage imports (written into the run's directory, which goes on
#: PYTHONPATH): decode RabbitMQ's bytes, optionally take ``slow`` seconds per message so a
#: short run still has messages moving through every kill, keep only the uid.
HANDLER = '''
import json
import time

from offbroadway import Message, Pipeline


class Chaos(Pipeline):
    def handle_message(self, processor, message: Message, context) -> Message:
        data = message.data
        if isinstance(data, (bytes, bytearray)):
            data = json.loads(data)
        if context.get("slow"):
            time.sleep(context["slow"])
        return message.update_data(lambda _: {"uid": int(data["uid"])}).put_batcher("spark")
'''


@dataclass
class ChaosOptions:
    source: str = "rabbitmq"                 # rabbitmq | spool
    messages: int = 50_000
    seed: int | None = None
    kill_seconds: float | None = None        # None: kill until the source is drained
    #: after kill_seconds, keep killing until every kind of ``kinds`` present was killed
    #: once (a short run on a busy machine spends most of it waiting for restarts), up to
    #: this many seconds of kill phase in all
    cover_by: float | None = None
    min_gap: float = 0.5
    max_gap: float = 2.0
    spark_kills: int | None = None           # at most this many Spark JVM kills (None: any)
    kinds: tuple[str, ...] = KINDS
    daemon_kill: bool = True
    daemon_kill_at: float = 0.4              # progress (fraction drained) of the daemon kill
    producers: int = 2
    processors: int = 2
    batch_processors: int = 2
    batch_size: int = 500
    batch_timeout: float = 0.5
    slow: float = 0.0                        # seconds per message in handle_message
    payload: int = 32
    spark_remote: str | None = None          # sc://… of a shared server (no spark child)
    spark_token_env: str | None = None       # the variable holding that server's token
    master: str = "local[2]"
    shutdown_timeout: float = 20.0
    settle_timeout: float = 600.0            # after the last kill, for the source to drain
    workdir: str | None = None               # default: a fresh dir under /tmp, removed
    keep: bool = False


@dataclass
class Incarnation:
    index: int
    pid: int
    log: str
    started_at: float
    exit_code: int | None = None
    up_after: float = 0.0      # seconds from start to the whole tree running
    final_restarts: dict[str, int] = field(default_factory=dict)


# -- the sources --------------------------------------------------------------------------

class RabbitSide:
    """A fresh queue with a dead-letter exchange feeding ``<queue>.dlq``; a new connection
    per call, so nothing here needs heartbeats during a long run."""

    def __init__(self, url: str = AMQP_URL) -> None:
        self.url = url
        self.queue = f"obchaos-{uuid.uuid4().hex[:10]}"
        self.dlx, self.dlq = f"{self.queue}.dlx", f"{self.queue}.dlq"

    def _channel(self) -> Any:
        import pika

        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        return conn, conn.channel()

    def create(self) -> None:
        conn, ch = self._channel()
        with conn:
            ch.exchange_declare(self.dlx, "fanout")
            ch.queue_declare(self.dlq)
            ch.queue_bind(self.dlq, self.dlx)
            ch.queue_declare(self.queue, arguments={"x-dead-letter-exchange": self.dlx})

    def publish(self, n: int, payload: int) -> None:
        import pika

        pad = "x" * payload
        conn, ch = self._channel()
        with conn:
            for i in range(n):
                ch.basic_publish("", self.queue, json.dumps({"uid": i, "pad": pad}).encode(),
                                 pika.BasicProperties(message_id=f"c{i}"))
        ready = 0
        deadline = time.monotonic() + 60
        while ready < n and time.monotonic() < deadline:   # publishes are asynchronous
            ready = self.ready(self.queue)
            time.sleep(0.05)
        if ready != n:
            raise RuntimeError(f"published {n} messages, the queue holds {ready}")

    def ready(self, queue: str) -> int:
        conn, ch = self._channel()
        with conn:
            return ch.queue_declare(queue, passive=True).method.message_count

    def counts(self) -> dict[str, tuple[int, int]]:
        """queue → (ready, unacked), from the broker's own books (rabbitmqctl)."""
        res = subprocess.run(["rabbitmqctl", "-q", "list_queues", "name", "messages_ready",
                              "messages_unacknowledged"], capture_output=True, text=True,
                             timeout=60, check=False)
        out = {}
        for line in res.stdout.splitlines():
            parts = line.split("\t")
            if len(parts) == 3 and parts[0] in (self.queue, self.dlq):
                out[parts[0]] = (int(parts[1]), int(parts[2]))
        return out

    def remaining(self) -> int:
        return self.ready(self.queue)

    def delete(self) -> None:
        conn, ch = self._channel()
        with conn:
            ch.queue_delete(self.queue)
            ch.queue_delete(self.dlq)
            ch.exchange_delete(self.dlx)


class SpoolSide:
    """N lines over many files, so "files left" is a fine enough progress measure."""

    def __init__(self, path: Path, state_dir: Path) -> None:
        self.path = path
        self.state_dir = state_dir
        self.per_file = 1

    def create(self) -> None:
        self.path.mkdir(parents=True)

    def publish(self, n: int, payload: int) -> None:
        files = max(4, min(100, n // 500))
        self.per_file = -(-n // files)
        pad = "x" * payload
        for f in range(files):
            lines = [json.dumps({"uid": i, "pad": pad})
                     for i in range(f * self.per_file, min(n, (f + 1) * self.per_file))]
            if lines:
                tmp = self.path / f"part-{f:04d}.tmp"
                tmp.write_text("\n".join(lines) + "\n")
                tmp.rename(self.path / f"part-{f:04d}.jsonl")

    def remaining(self) -> int:
        return len(list(self.path.glob("*.jsonl"))) * self.per_file

    def dead_letters(self) -> int:
        dl = self.state_dir / "spool" / "dead-letter.jsonl"
        return len(dl.read_text().splitlines()) if dl.exists() else 0


# -- the run ------------------------------------------------------------------------------

def config_text(opts: ChaosOptions, tmp: Path, source_options: dict) -> str:
    src = "\n".join(f"{k} = {json.dumps(v)}" for k, v in source_options.items())
    spark = [f"output = {json.dumps(str(tmp / 'dataset'))}", 'schema = "uid BIGINT"']
    if opts.spark_remote:
        spark += [f"remote = {json.dumps(opts.spark_remote)}",
                  f"token_env = {json.dumps(opts.spark_token_env or '')}"]
    else:
        spark.append(f"master = {json.dumps(opts.master)}")
    spark_lines = "\n".join(spark)
    return f"""
[pipeline]
name = "chaos"
handler = "chaos_handler:Chaos"
shutdown_timeout = {opts.shutdown_timeout}
context = {{ slow = {opts.slow} }}

[producer]
source = "{opts.source}"
concurrency = {opts.producers}

[producer.options]
{src}

[processors.default]
concurrency = {opts.processors}
max_demand = 10
min_demand = 5

[batchers.{BATCHER}]
batch_size = {opts.batch_size}
batch_timeout = {opts.batch_timeout}
concurrency = {opts.batch_processors}

[spark]
{spark_lines}

[metrics]
listen = ""

[runtime]
dir = "{tmp / 'run'}"
state_dir = "{tmp / 'state'}"
log_format = "json"
"""


class ChaosRun:
    """One run: set up, kill, settle, check.  ``run()`` returns the report."""

    def __init__(self, opts: ChaosOptions, log: Callable[[str], None] = print) -> None:
        if opts.source not in ("rabbitmq", "spool"):
            raise ValueError(f"source must be rabbitmq or spool, not {opts.source!r}")
        if not 0 < opts.min_gap <= opts.max_gap:
            raise ValueError("need 0 < min_gap <= max_gap")
        unknown = set(opts.kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
        self.opts = opts
        self.say = log
        self.rng = random.Random(opts.seed)
        self.problems: list[str] = []
        self.kills: list[Kill] = []
        self.incarnations: list[Incarnation] = []
        self.orphans: list[str] = []
        #: "node:state" → kill slots that found it not running (why kills were late)
        self.blocked: Counter = Counter()
        #: kills of this incarnation that no status has reflected yet (:func:`unseen_kills`)
        self.unseen: list[Kill] = []
        self.load = LoadWindow()
        self.t0 = time.monotonic()
        self.proc: subprocess.Popen | None = None

    # -- helpers ---------------------------------------------------------------------------
    def now(self) -> float:
        return time.monotonic() - self.t0

    def status(self) -> dict | None:
        from offbroadway.daemon.cli import control

        try:
            reply = control.request(str(self.sock), {"cmd": "status"}, timeout=10)
        except (control.ControlError, OSError, ValueError):
            return None
        status = reply.get("status") if reply.get("ok") else None
        if status is not None:
            self.load.add(self.now(), status)
        return status

    def seen_all(self, status: dict) -> bool:
        """Does ``status`` reflect every kill so far?  A kill once seen stays seen (its pid
        is gone for good), so later statuses need not be checked for it again."""
        self.unseen = unseen_kills(status, self.unseen)
        return not self.unseen

    def settled(self) -> dict | None:
        """A status that has seen every kill and shows the whole tree running, or None."""
        status = self.status()
        if status is None:
            return None
        if not self.seen_all(status):
            # would have passed a kill the daemon had not read yet: count it, it is the race
            self.blocked.update(f"{k.child}:kill-not-seen" for k in self.unseen)
            return None
        return status if all_running(status) else None

    def daemon_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_for(self, what: str, predicate: Callable[[], Any], timeout: float,
                 interval: float = 0.2) -> Any:
        """Poll ``predicate`` until truthy; a daemon that exits meanwhile ends the wait."""
        return wait_alive(what, predicate, timeout, interval, self.proc, ChaosAbort)

    def progress(self) -> float:
        try:
            return 1.0 - self.side.remaining() / self.opts.messages
        except Exception:   # the broker busy: progress is only a hint for the daemon kill
            return 0.0

    # -- set-up ----------------------------------------------------------------------------
    def setup(self) -> None:
        opts = self.opts
        if opts.workdir:
            self.tmp = Path(opts.workdir)
            self.tmp.mkdir(parents=True, exist_ok=True)
        else:
            self.tmp = Path(tempfile.mkdtemp(prefix="obc-", dir="/tmp"))
        os.chmod(self.tmp, 0o700)
        (self.tmp / "chaos_handler.py").write_text(HANDLER)
        self.sock = self.tmp / "run" / "control.sock"
        self.dataset = self.tmp / "dataset"
        if opts.source == "rabbitmq":
            self.side: RabbitSide | SpoolSide = RabbitSide()
            source_options = {"url": AMQP_URL, "queue": self.side.queue, "on_failure": "reject"}
        else:
            self.side = SpoolSide(self.tmp / "spool", self.tmp / "state")
            source_options = {"path": str(self.tmp / "spool"), "scan_interval": 0.2}
        self.side.create()
        t = time.monotonic()
        self.side.publish(opts.messages, opts.payload)
        self.say(f"chaos: {opts.messages} messages in {opts.source} "
                 f"({time.monotonic() - t:.1f}s); work dir {self.tmp}")
        self.config = self.tmp / "chaos.toml"
        self.config.write_text(config_text(opts, self.tmp, source_options))
        self.root = spec_tree(str(self.config))
        self.budget = KillBudget(self.root)

    def start_daemon(self) -> None:
        index = len(self.incarnations) + 1
        log = self.tmp / f"daemon-{index}.log"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.tmp), str(REPO),
                                                          env.get("PYTHONPATH")]))
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        with open(log, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "offbroadway.daemon.cli", "run", str(self.config)],
                cwd=REPO, env=env, stdout=err, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL)
        inc = Incarnation(index, self.proc.pid, str(log), self.now())
        self.incarnations.append(inc)
        t = time.monotonic()
        self.wait_for("the tree to be up", lambda: (s := self.status()) and all_running(s),
                      timeout=300)
        inc.up_after = round(time.monotonic() - t, 1)
        self.say(f"chaos: daemon {index} (pid {self.proc.pid}) up in {inc.up_after}s")

    # -- killing ---------------------------------------------------------------------------
    def pick(self, status: dict) -> tuple[str, dict] | None:
        spark_left = (self.opts.spark_kills is None or
                      sum(k.kind == "spark" for k in self.kills) < self.opts.spark_kills)
        kinds = [k for k in self.opts.kinds if k != "spark" or spark_left]
        by_kind = eligible(status, self.root, kinds)
        now = self.now()
        by_kind = {k: [n for n in nodes if self.budget.allows(n["id"], now)]
                   for k, nodes in by_kind.items()}
        by_kind = {k: v for k, v in by_kind.items() if v}
        if not by_kind:
            return None
        # kinds not hit yet in this run first, so a short run still covers every kind
        fresh = sorted(set(by_kind) - {k.kind for k in self.kills})
        kind = self.rng.choice(fresh or sorted(by_kind))
        return kind, self.rng.choice(by_kind[kind])

    def kill_stage(self, status: dict, kind: str, node: dict) -> bool:
        pid = int(node["pid"])
        target = pid
        if kind == "spark":
            try:
                jvm = [p for p in psutil.Process(pid).children() if "java" in p.name()]
            except psutil.Error:
                return False
            if not jvm:
                return False
            target = jvm[0].pid
        inflight, buffered = self.load.bound()
        try:
            os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            return False
        now = self.now()
        self.budget.record(node["id"], now)
        kill = Kill(now, len(self.incarnations), node["id"], kind, pid, target, inflight,
                    buffered, self.progress())
        self.kills.append(kill)
        self.unseen.append(kill)
        self.say(f"chaos: {now:7.1f}s kill {node['id']} (pid {target}); producers in flight "
                 f"{inflight}, buffered {buffered}")
        return True

    def kill_daemon(self) -> None:
        """SIGKILL the daemon; its whole tree must go with it; then start it again."""
        assert self.proc is not None
        # Killed once the tree is settled: the restart counters of this incarnation are
        # then final and can be checked against its kills before they are lost with it.
        status = self.wait_for("the tree to settle before the daemon kill", self.settled,
                               timeout=300)
        inc = self.incarnations[-1]
        inc.final_restarts = restarts_of(status)
        self.check_restarts(inc, settle=status)
        try:
            tree = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            tree = []
        inflight, buffered = self.load.bound()
        self.proc.send_signal(signal.SIGKILL)
        inc.exit_code = self.proc.wait(30)
        now = self.now()
        self.kills.append(Kill(now, inc.index, "daemon", "daemon", self.proc.pid, self.proc.pid,
                               inflight, buffered, self.progress(), outcome="daemon"))
        self.say(f"chaos: {now:7.1f}s kill the daemon (pid {self.proc.pid}, "
                 f"{len(tree)} descendants); producers in flight {inflight}")

        def gone() -> bool:
            return not [p for p in tree if _alive(p)]

        deadline = time.monotonic() + 15
        while not gone() and time.monotonic() < deadline:
            time.sleep(0.05)
        survivors = [p for p in tree if _alive(p)]
        for p in survivors:
            try:
                self.orphans.append(f"pid {p.pid} {' '.join(p.cmdline())[:200]}")
                p.kill()
            except psutil.Error:
                pass
        if survivors:
            self.problems.append(f"{len(survivors)} processes outlived the SIGKILLed daemon: "
                                 f"{self.orphans}")
        self.start_daemon()

    def check_restarts(self, inc: Incarnation, settle: dict) -> None:
        """This incarnation's restart counters against the kills it took."""
        classes: dict[int, str] = {}
        with open(inc.log) as f:
            classes = classify_exits(f)
        mine = [k for k in self.kills if k.incarnation == inc.index and k.kind != "daemon"]
        for k in mine:
            k.outcome = classes.get(k.pid, "unknown")
        expected = expected_restarts(self.root, [k.child for k in mine if k.outcome == "counted"])
        bad = compare_restarts(restarts_of(settle), expected)
        if bad:
            self.problems.append(f"daemon {inc.index}: restart counters do not match the "
                                 f"{len(mine)} kills ({[k.child for k in mine]}): {bad}")
        lost = [k for k in mine if k.outcome != "counted"]
        if lost:
            self.say(f"chaos: daemon {inc.index}: {len(lost)} kills not counted as crashes: "
                     f"{[(k.child, k.outcome) for k in lost]}")

    def chaos(self) -> None:
        opts = self.opts
        start = self.now()
        next_kill = start + self.rng.uniform(opts.min_gap, opts.max_gap)
        daemon_killed = not opts.daemon_kill
        while True:
            if not self.daemon_alive():
                raise ChaosAbort(f"the daemon exited with {self.proc and self.proc.returncode} "
                                 f"during the chaos")
            now = self.now()
            uncovered = self.uncovered() if opts.cover_by is not None else set()
            if opts.kill_seconds is not None and now - start >= opts.kill_seconds and (
                    not uncovered or now - start >= (opts.cover_by or 0)):
                break
            if now < next_kill:
                self.status()          # keeps the in-flight window fresh between kills
                time.sleep(min(0.25, max(0.0, next_kill - self.now())))
                continue
            if not uncovered and self.side.remaining() == 0 and self.finished():
                break
            if not daemon_killed and self.progress() >= opts.daemon_kill_at:
                self.kill_daemon()
                daemon_killed = True
                next_kill = self.now() + self.rng.uniform(opts.min_gap, opts.max_gap)
                continue
            status = self.status()
            if status and not self.seen_all(status):
                # the last kill's exit not read yet: this status is from before it
                self.blocked.update(f"{k.child}:kill-not-seen" for k in self.unseen)
                time.sleep(0.1)
                continue
            choice = self.pick(status) if status else None
            if choice is None and status:
                self.blocked.update(f"{n['id']}:{n['state']}"
                                    for n in snapshot_nodes(status["tree"])
                                    if n["state"] != "running")
            if choice is None or not self.kill_stage(status, *choice):
                time.sleep(0.1)    # nothing may be killed right now: try again shortly
                continue
            next_kill = self.now() + self.rng.uniform(opts.min_gap, opts.max_gap)
        self.kill_phase = self.now() - start
        if not daemon_killed:     # drained before the planned moment: still once per run
            self.kill_daemon()

    def uncovered(self) -> set[str]:
        """Kinds in the tree (and asked for) that were not killed yet."""
        present = {kind_of(n.id) for n in workers_under(self.root)} & set(self.opts.kinds)
        if self.opts.spark_kills == 0:
            present.discard("spark")
        return present - {k.kind for k in self.kills}

    # -- settling and checks ---------------------------------------------------------------
    def finished(self) -> bool:
        """Everything acked: the broker holds nothing ready or unacked (spool: no file)."""
        if isinstance(self.side, RabbitSide):
            counts = self.side.counts().get(self.side.queue)
            return counts == (0, 0)
        return self.side.remaining() == 0

    def settle(self) -> dict:
        self.wait_for("the source to be drained and everything acked",
                      lambda: self.side.remaining() == 0 and self.finished(),
                      timeout=self.opts.settle_timeout, interval=1.0)
        return self.wait_for("the tree to be running with every kill seen", self.settled,
                             timeout=120)

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(self.opts.shutdown_timeout + 60)
        except subprocess.TimeoutExpired:
            self.problems.append("the daemon did not exit within shutdown_timeout + 60 s of "
                                 "SIGTERM (killed)")
            self.proc.kill()
            code = self.proc.wait()
        return code

    def read_output(self) -> list[int]:
        import pyarrow.parquet as pq

        path = self.dataset / BATCHER
        if not path.exists():
            return []
        return pq.read_table(path, columns=["uid"]).column("uid").to_pylist()

    def run(self) -> dict[str, Any]:
        report: dict[str, Any] = {"options": asdict(self.opts), "load_before": os.getloadavg()}
        try:
            self.setup()
            report["workdir"] = str(self.tmp)
            started = time.monotonic()
            self.start_daemon()
            self.chaos()
            t = time.monotonic()
            final = self.settle()
            report["settle_s"] = round(time.monotonic() - t, 1)
            inc = self.incarnations[-1]
            inc.final_restarts = restarts_of(final)
            self.check_restarts(inc, settle=final)
            t = time.monotonic()
            inc.exit_code = self.stop()
            report["stop_s"] = round(time.monotonic() - t, 1)
            if inc.exit_code != 0:
                self.problems.append(f"the daemon exited with {inc.exit_code} on SIGTERM")
            report["elapsed_s"] = round(time.monotonic() - started, 1)
            report["kill_phase_s"] = round(self.kill_phase, 1)
            self.check_source(report)
            self.check_output(report)
        except ChaosAbort as exc:
            self.problems.append(str(exc))
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        finally:
            report["load_after"] = os.getloadavg()
            report["kills"] = [asdict(k) for k in self.kills]
            report["kills_by_kind"] = dict(Counter(k.kind for k in self.kills))
            report["kill_outcomes"] = dict(Counter(k.outcome for k in self.kills))
            report["incarnations"] = [asdict(i) for i in self.incarnations]
            report["orphans"] = self.orphans
            report["blocked"] = dict(self.blocked.most_common(12))
            for inc in self.incarnations:
                for sup in gave_up(self.root, inc.log):
                    self.problems.append(f"daemon {inc.index}: {sup} exceeded its restart "
                                         f"intensity and gave up")
            report["problems"] = self.problems
            report["ok"] = not self.problems
            self.cleanup()
        return report

    def check_source(self, report: dict) -> None:
        if isinstance(self.side, RabbitSide):
            counts = self.side.counts()
            report["broker"] = {q: {"ready": r, "unacked": u} for q, (r, u) in counts.items()}
            q = counts.get(self.side.queue)
            if q != (0, 0):
                self.problems.append(f"queue {self.side.queue}: (ready, unacked) = {q}")
            dl = counts.get(self.side.dlq, (0, 0))[0]
            if dl:
                self.problems.append(f"{dl} messages were dead-lettered (failed)")
        else:
            left = self.side.remaining()
            dead = self.side.dead_letters()
            report["spool"] = {"files_left": left // max(1, self.side.per_file),
                               "dead_letters": dead}
            if left or dead:
                self.problems.append(f"spool: {left} lines left, {dead} dead-lettered")

    def check_output(self, report: dict) -> None:
        out = output_check(self.read_output(), self.opts.messages)
        bound = sum(k.inflight for k in self.kills)
        out["duplicate_bound"] = bound
        report["output"] = out
        if out["missing"]:
            self.problems.append(f"{out['missing']} messages missing from the output, e.g. "
                                 f"{out['missing_sample']}")
        if out["unexpected"]:
            self.problems.append(f"uids never published in the output: {out['unexpected']}")
        if out["duplicates"] > bound:
            self.problems.append(f"{out['duplicates']} duplicates, more than the {bound} "
                                 f"messages in flight at the kills")

    def cleanup(self) -> None:
        if isinstance(getattr(self, "side", None), RabbitSide):
            try:
                self.side.delete()
            except Exception as exc:   # cleanup must not hide the report
                self.say(f"chaos: could not delete queue {self.side.queue}: {exc}")
        if hasattr(self, "tmp") and not self.opts.keep and not self.opts.workdir:
            shutil.rmtree(self.tmp, ignore_errors=True)


class ChaosAbort(RuntimeError):
    """The run cannot go on (the daemon died, a stall): reported as a problem."""


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def run_chaos(opts: ChaosOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    return ChaosRun(opts, log).run()
