"""Chaos: a pipeline with the Spark sink processes N messages while stages are SIGKILLed.

    .venv/bin/python bench/chaos.py --source rabbitmq --messages 50000
    .venv/bin/python bench/chaos.py --source spool --messages 50000 [--json report.json]

What one run does (issue 8, item 1):

1. Writes a config: the ``rabbitmq`` source on a fresh queue with a dead-letter exchange
   (``on_failure = "reject"``, so a failed message shows up in ``<queue>.dlq`` instead of
   vanishing) or the ``spool`` source on a fresh directory; 2 producers, 2 processors, one
   batcher ``spark`` with 2 batch processors, and the Spark sink into a temp dir (the
   daemon's own local Spark Connect server, or ``--spark-remote`` for a shared one).
2. Publishes / writes N messages ``{"uid": i, "pad": …}`` with unique ``uid`` 0…N-1.
3. Starts ``offbroadway run`` and, every ``uniform(0.5, 2)`` s, SIGKILLs one stage picked
   at random: first a kind (producer, processor, batcher, batch processor, the Spark
   server JVM; kinds not killed yet first), then an instance.  Each kill is recorded with
   the child id, pid and the producers' ``inflight`` and ``buffered`` counts (each
   producer's largest in the statuses of the last 3 s, :class:`LoadWindow`).  Once per
   run, when ``daemon_kill_at`` of the source is drained and the tree has settled, the
   daemon itself is SIGKILLed instead; every process of its tree must be gone (psutil)
   before it is started again on the same config and runtime dir.
4. Stops killing when the source is drained (or after ``--kill-seconds``), waits until
   the queue has nothing ready or unacked (``rabbitmqctl list_queues``) / the spool has no
   file left, stops the daemon with SIGTERM (exit 0 expected) and reads the dataset back
   with pyarrow.

Checks (each failure is a line in ``report["problems"]``): every uid is in the output at
least once and nothing else is; the broker holds nothing ready or unacked and the
dead-letter queue is empty (spool: no file left, no dead-letter file); duplicates are at
most the sum of the in-flight counts recorded at the kills; the restart counters of
``status --json`` of each daemon incarnation equal what the supervision tree's strategies
predict for the kills that incarnation took (:func:`expected_restarts`); no process of the
SIGKILLed daemon's tree outlived it; the daemon never gave up and exited 0 on SIGTERM.

Restart intensity.  The defaults allow 3 restarts in 5 s per supervisor (the pipeline
supervisor's own come from ``[pipeline] max_restarts``/``max_seconds``; the killer reads
every supervisor's from the tree the daemon builds, :func:`spec_tree`), and a processor or
batch processor crash is charged to the supervisor *above* its own (their supervisors have
``max_restarts = 0`` and escalate at once): processors and the Spark server to
``PipelineSupervisor``, batchers and batch processors to ``BatcherSupervisor_<key>``,
producers to ``ProducerSupervisor``.  A kill every 0.5-2 s picked blindly would exceed
that (four processor kills inside 5 s happen in a few percent of windows), and the daemon
giving up would then be the test's doing, not a finding.  So the killer keeps OTP's own
books (:class:`KillBudget`): a kill is allowed only while the supervisor it is charged to
has taken at most ``max_restarts - 2`` kills within ``max_seconds`` + 2 s (one restart
stays spare for a secondary crash, the 2 s cover the time between our kill and the
supervisor's count), and only when everything the kill's cascade restarts and every
ancestor is ``running`` (:func:`eligible`: a busy supervisor counts an exit late, which
would compress the spacing the budget assumes, and a restart in progress can be cancelled
by its parent's, which makes restart counts depend on timing).  With those rules any
restart count beyond the kills is the pipeline's own and the intensity never trips by
our hand; if the daemon still gives up, that is reported.

A status is only believed once it has seen every kill (:func:`unseen_kills`).  SIGKILL
is asynchronous: the process dies, then the daemon's loop reads its pidfd, and a status
answered in between shows the killed worker ``running`` with its old pid and the old
restart counters.  Such a status made a kill look eligible while the previous one's
cascade had not begun, and (the flake that found it) made the final books read right after
the last kill, one restart short of the kills.  So no kill, settle or daemon kill goes by
a status in which a killed worker still shows the pid it was killed under; once the new
pid (or none) shows, the worker and its supervisors are in a non-running state until the
whole cascade is done, because the daemon changes them on the same loop turn.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
from offbroadway.daemon import names
from offbroadway.supervision.tree import SpecTree, workers_under
from offbroadway.supervision.tree import walk as walk_specs

REPO = Path(__file__).resolve().parent.parent
AMQP_URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
KINDS = ("producer", "processor", "batcher", "batch_processor", "spark")
BATCHER = "spark"
#: A kill may be charged to a supervisor while it has taken at most max_restarts - RESERVE
#: kills in max_seconds + BUDGET_MARGIN (see the module doc).
RESERVE = 1
BUDGET_MARGIN = 2.0

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


# -- options and records ------------------------------------------------------------------

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
class Kill:
    at: float                  # seconds since the run started
    incarnation: int           # 1 for the first daemon, 2 after the daemon kill
    child: str                 # child id, or "daemon"
    kind: str
    pid: int                   # the pid in status (for spark: the wrapper's)
    signalled_pid: int         # what got SIGKILL (for spark: the JVM)
    inflight: int              # producers' in flight, each at its 3 s maximum (LoadWindow)
    buffered: int
    progress: float            # fraction of the source drained, roughly
    outcome: str = "unknown"   # counted | during-stop | unknown (from the daemon's log)


@dataclass
class Incarnation:
    index: int
    pid: int
    log: str
    started_at: float
    exit_code: int | None = None
    up_after: float = 0.0      # seconds from start to the whole tree running
    final_restarts: dict[str, int] = field(default_factory=dict)


# -- the pure part: the tree's books -------------------------------------------------------

def spec_tree(config_path: str) -> Any:
    """The supervision tree the daemon builds from this config (its root SupervisorSpec),
    so strategies and intensities are read, not assumed."""
    from offbroadway.daemon import topology
    from offbroadway.daemon.config import load_config

    return topology.wired(load_config(config_path).config).root


def charged_supervisor(root: Any, child_id: str) -> tuple[Any, str]:
    """The supervisor whose restart intensity a crash of ``child_id`` consumes, and the id
    of its child that it sees failing: asked of the supervision library
    (:meth:`~offbroadway.supervision.tree.SpecTree.crash_target`), which knows OTP's
    escalation, rather than modelled here."""
    sup, failed = SpecTree(root).crash_target(child_id)
    assert sup is not None, f"{child_id} is the root: nothing absorbs its crash"
    return sup, failed


def expected_restarts(root: Any, crashed: Iterable[str]) -> Counter:
    """Restart counters after these crashes, as ``status`` counts them: every start of a
    node after its first adds one, and a restarted supervisor starts all its children.
    Which children a crash restarts is the supervision library's answer
    (:meth:`~offbroadway.supervision.tree.SpecTree.restarted_by`)."""
    counts: Counter = Counter()
    tree = SpecTree(root)
    for child in crashed:
        for restarted in tree.restarted_by(child):
            counts.update(spec.id for spec in walk_specs(tree.node[restarted]))
    return counts


class KillBudget:
    """The killer's copy of OTP's books: which supervisor each kill is charged to, and
    whether one more kill keeps every supervisor clear of its intensity (module doc)."""

    def __init__(self, root: Any, reserve: int = RESERVE, margin: float = BUDGET_MARGIN) -> None:
        self.root = root
        self.reserve = reserve
        self.margin = margin
        self._times: dict[str, deque[float]] = {}

    def allows(self, child_id: str, now: float) -> bool:
        sup, _ = charged_supervisor(self.root, child_id)
        times = self._times.get(sup.id, deque())
        recent = sum(1 for t in times if t >= now - sup.max_seconds - self.margin)
        return recent + 1 <= sup.max_restarts - self.reserve

    def record(self, child_id: str, now: float) -> None:
        sup, _ = charged_supervisor(self.root, child_id)
        self._times.setdefault(sup.id, deque()).append(now)


def walk(node: dict) -> Iterator[tuple[dict, list[dict]]]:
    """Every node of a status tree with its ancestors (nearest last)."""
    stack: list[tuple[dict, list[dict]]] = [(node, [])]
    while stack:
        n, up = stack.pop()
        yield n, up
        for c in n.get("children", []):
            stack.append((c, [*up, n]))


def kind_of(child_id: str) -> str | None:
    """The kind of worker the bench kills: a stage's role (committers are not killed here)
    or ``spark``; None for anything else."""
    role = names.role_of(child_id)
    if role in (names.BATCH_PROCESSOR, names.PRODUCER, names.PROCESSOR, names.BATCHER):
        return role
    return "spark" if child_id == "spark" else None


def eligible(status: dict, root: Any, kinds: Iterable[str]) -> dict[str, list[dict]]:
    """Kind → running workers whose kill would be handled at once and in full: every node
    its cascade restarts is running, and so is every ancestor (module doc).

    A supervisor that is busy (restarting, or stopping a subtree after giving up) handles
    an exit late, or has the restart it is carrying out cancelled by its parent's; both
    are legitimate, but then the restart counters no longer follow from the kills alone.
    """
    out: dict[str, list[dict]] = {}
    wanted = set(kinds)
    state = {n["id"]: n["state"] for n, _ in walk(status["tree"])}
    for node, ancestors in walk(status["tree"]):
        kind = kind_of(node["id"])
        if node["kind"] != "worker" or kind not in wanted or not node.get("pid"):
            continue
        cascade = expected_restarts(root, [node["id"]])
        if all(state.get(cid) == "running" for cid in cascade) and \
                all(a["state"] == "running" for a in ancestors):
            out.setdefault(kind, []).append(node)
    return out


def unseen_kills(status: dict, kills: Iterable[Kill]) -> list[Kill]:
    """The kills this status does not reflect yet: the killed worker still shows the pid it
    was killed under (the daemon has not read its exit; module doc).  A worker the daemon
    has seen exit shows no pid or its successor's, so this is exact, not a guess."""
    pids = {n["id"]: n.get("pid") for n, _ in walk(status["tree"])}
    return [k for k in kills if k.child in pids and pids[k.child] == k.pid]


def all_running(status: dict) -> bool:
    return all(n["state"] == "running" for n, _ in walk(status["tree"]))


def producer_load(status: dict) -> dict[str, tuple[int, int]]:
    """Producer id → (in flight, buffered) from its last stats report (≤ 1 s old)."""
    out = {}
    for n, _ in walk(status["tree"]):
        if kind_of(n["id"]) == "producer":
            m = n.get("messages", {})
            out[n["id"]] = (int(m.get("inflight", 0)), int(m.get("buffered", 0)))
    return out


class LoadWindow:
    """The producers' in-flight counts over the last ``seconds``: the bound on what a kill
    can duplicate.  One status alone is not enough: stats are up to a second old, and a
    producer restarted a moment ago reports 0 while its predecessor's messages are still
    being written downstream.  So each producer counts with the largest figure any status
    of the window showed for it (measured: the single-status bound was exceeded)."""

    def __init__(self, seconds: float = 3.0) -> None:
        self.seconds = seconds
        self._samples: deque[tuple[float, dict[str, tuple[int, int]]]] = deque()

    def add(self, now: float, status: dict) -> None:
        self._samples.append((now, producer_load(status)))
        while self._samples and self._samples[0][0] < now - self.seconds:
            self._samples.popleft()

    def bound(self) -> tuple[int, int]:
        """(in flight, buffered), each producer at its window maximum, summed."""
        inflight: dict[str, int] = {}
        buffered: dict[str, int] = {}
        for _, load in self._samples:
            for pid, (i, b) in load.items():
                inflight[pid] = max(inflight.get(pid, 0), i)
                buffered[pid] = max(buffered.get(pid, 0), b)
        return sum(inflight.values()), sum(buffered.values())


def restarts_of(status: dict) -> dict[str, int]:
    return {n["id"]: int(n["restarts"]) for n, _ in walk(status["tree"])
            if n["id"] != "terminator"}


_EXIT = re.compile(r"^worker (\S+) \(pid (\d+)\) of (\S+) (.*)$")


def classify_exits(log_lines: Iterable[str]) -> dict[int, str]:
    """pid → ``counted`` (an unexpected exit the supervisor restarts: logged as a warning)
    or ``during-stop`` (an exit while the supervisor was stopping it anyway: info)."""
    out: dict[int, str] = {}
    for line in log_lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict) or rec.get("logger") != "offbroadway.supervision":
            continue
        m = _EXIT.match(str(rec.get("msg", "")))
        if m is None:
            continue
        pid = int(m.group(2))
        out[pid] = "counted" if rec.get("level") == "warning" else "during-stop"
    return out


def compare_restarts(observed: dict[str, int], expected: Counter) -> list[str]:
    return [f"{cid}: {n} restarts, {expected.get(cid, 0)} expected"
            for cid, n in sorted(observed.items()) if n != expected.get(cid, 0)]


def output_check(uids: list[int], n: int) -> dict[str, Any]:
    counts = Counter(uids)
    missing = sorted(set(range(n)) - set(counts))
    unexpected = sorted(u for u in counts if not 0 <= u < n)
    return {"rows": len(uids), "distinct": len(counts), "missing": len(missing),
            "missing_sample": missing[:20], "unexpected": unexpected[:20],
            "duplicates": len(uids) - len(counts),
            "max_copies": max(counts.values()) if counts else 0}


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
        from offbroadway.daemon import control

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
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if not self.daemon_alive():
                raise ChaosAbort(f"the daemon exited with {self.proc and self.proc.returncode} "
                                 f"while waiting for {what}")
            if time.monotonic() > deadline:
                raise ChaosAbort(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(interval)

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
                self.blocked.update(f"{n['id']}:{n['state']}" for n, _ in walk(status["tree"])
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


_GAVE_UP = re.compile(r"supervisor (\S+) gave up")


def gave_up(root: Any, log_path: str) -> list[str]:
    """Supervisors that gave up because their intensity was exceeded (``max_restarts = 0``
    ones escalate by design, at every crash of a child: not a finding)."""
    limits = {n.id: n.max_restarts for n in walk_specs(root) if n.type == "supervisor"}
    out = []
    try:
        with open(log_path) as f:
            for line in f:
                m = _GAVE_UP.search(line)
                if m and limits.get(m.group(1), 1) > 0 and m.group(1) not in out:
                    out.append(m.group(1))
    except OSError:
        pass
    return out


def run_chaos(opts: ChaosOptions, log: Callable[[str], None] = print) -> dict[str, Any]:
    return ChaosRun(opts, log).run()


def summary(report: dict) -> str:
    o = report["options"]
    out = report.get("output", {})
    lines = [
        f"chaos {o['source']}: {o['messages']} messages, {len(report['kills'])} kills "
        f"{report['kills_by_kind']} ({report['kill_outcomes']}), "
        f"kill phase {report.get('kill_phase_s', '?')} s, settle {report.get('settle_s', '?')} s, "
        f"stop {report.get('stop_s', '?')} s, total {report.get('elapsed_s', '?')} s",
        f"  output: {out.get('rows', '?')} rows, {out.get('distinct', '?')} distinct, "
        f"missing {out.get('missing', '?')}, duplicates {out.get('duplicates', '?')} "
        f"(bound {out.get('duplicate_bound', '?')}, max copies {out.get('max_copies', '?')})",
        "  daemons: " + ", ".join(f"#{i['index']} up in {i['up_after']} s, exit "
                                   f"{i['exit_code']}, restarts "
                                   f"{sum(i['final_restarts'].values())}"
                                   for i in report["incarnations"]),
        f"  load: before {tuple(round(x, 2) for x in report['load_before'])}, after "
        f"{tuple(round(x, 2) for x in report['load_after'])}",
        "  OK" if report["ok"] else "  PROBLEMS:\n    " + "\n    ".join(report["problems"]),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", choices=("rabbitmq", "spool"), default="rabbitmq")
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--kill-seconds", type=float, default=None,
                    help="stop killing after this long (default: when the source is drained)")
    ap.add_argument("--gap", type=float, nargs=2, default=(0.5, 2.0), metavar=("MIN", "MAX"))
    ap.add_argument("--spark-kills", type=int, default=None)
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    ap.add_argument("--no-daemon-kill", action="store_true")
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--slow", type=float, default=0.0)
    ap.add_argument("--spark-remote", default=None)
    ap.add_argument("--spark-token-env", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the work dir")
    ap.add_argument("--json", default=None, help="write the report here")
    args = ap.parse_args(argv)
    opts = ChaosOptions(
        source=args.source, messages=args.messages, seed=args.seed,
        kill_seconds=args.kill_seconds, min_gap=args.gap[0], max_gap=args.gap[1],
        spark_kills=args.spark_kills, kinds=tuple(args.kinds),
        daemon_kill=not args.no_daemon_kill, batch_size=args.batch_size, slow=args.slow,
        spark_remote=args.spark_remote, spark_token_env=args.spark_token_env, keep=args.keep)
    report = run_chaos(opts)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    print(summary(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
