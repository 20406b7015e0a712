"""The ``offbroadway`` command: run a pipeline, check a config, steer a running daemon."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

from offbroadway.stages.runtime.logs import configure as configure_logging
from offbroadway.stages.runtime.logs import prefix
from offbroadway.supervision.tree import snapshot_nodes

from ..config.names import PRODUCER, role_of
from . import control

if TYPE_CHECKING:
    from ..config.records import Config

EXIT_CONFIG = 2


def _load(path: str, *, full: bool = False):
    """The validated config, or exit 2 naming the key at fault (the contract of ``check``).

    With ``full``, also everything ``run`` would refuse at start (:func:`checks.preflight`:
    directories, the source's options and files, the handler, pyspark and Java); returns
    (config, notes on what only a running daemon can tell).
    """
    from ..config.checks import preflight
    from ..config.load import ConfigError, load_config

    notes: list[str] = []
    try:
        loaded = load_config(path)
        if full:
            notes = preflight(loaded.config)
    except ConfigError as exc:
        _fail(f"invalid config {path}: {exc}", EXIT_CONFIG)
    except OSError as exc:
        _fail(f"cannot read config {path}: {exc}", EXIT_CONFIG)
    for warning in loaded.warnings:
        print(f"{prefix(logging.WARNING)}offbroadway: warning: {_one_line(warning)}",
              file=sys.stderr)
    return (loaded.config, notes) if full else loaded.config


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _fail(message: str, code: int = 1) -> NoReturn:
    print(f"{prefix(logging.ERROR)}offbroadway: {_one_line(message)}", file=sys.stderr)
    sys.exit(code)


def cmd_check(args: argparse.Namespace) -> int:
    config, notes = _load(args.config, full=True)
    from ..spark.wiring import stop_budget

    print(f"{args.config}: ok (pipeline {config.pipeline.name}; a stop takes at most "
          f"{stop_budget(config):g} s)")
    window = _auto_window_line(config)
    if window:
        print(f"  {window}")
    for note in notes:
        print(f"  not checked: {note}")
    return 0


def _auto_window_line(config: Config) -> str | None:
    """What a broker source's ``"auto"`` window comes out at for this config (None: the
    source has no window, or it is set explicitly)."""
    from offbroadway.stages.sources import window_option

    from ..core.topology import auto_window

    option = window_option(config.producer.source)
    if option is None or config.producer.options.get(option, "auto") != "auto":
        return None
    w = auto_window(config)
    if w.note:
        return w.note
    return (f"producer.options.{option} \"auto\": {w.prefetch:,} per producer (what the "
            f"pipeline holds with every stage fed)")


def cmd_spark_verify(args: argparse.Namespace) -> int:
    config = _load(args.config)
    from ..spark.verify import verify

    return verify(config)


def cmd_test(args: argparse.Namespace) -> int:
    """The pipeline on fixture messages, in one process (:mod:`.rehearsal`)."""
    config = _load(args.config)
    from ..config.checks import check_handler
    from ..config.load import ConfigError
    from .rehearsal import FixtureError, rehearse

    try:
        check_handler(config)
        return rehearse(config, args.fixtures, args.expect)
    except (ConfigError, FixtureError) as exc:
        _fail(str(exc), EXIT_CONFIG)


def _spark_config(path: str) -> Config:
    config = _load(path)
    if config.spark is None:
        _fail(f"{path}: the config has no [spark] section", EXIT_CONFIG)
    return config


def cmd_spark_sql(args: argparse.Namespace) -> int:
    config = _spark_config(args.config)
    from ..spark.query import run_sql

    return run_sql(config, args.query, limit=args.limit, as_json=args.json)


def cmd_spark_conf(args: argparse.Namespace) -> int:
    config = _spark_config(args.config)
    from ..spark.query import snippet

    print(snippet(config))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    config, _notes = _load(args.config, full=True)
    configure_logging(config.runtime.log_level, config.runtime.log_format, "daemon")
    if args.until_idle:
        from ..config.checks import nothing_to_read

        idle = nothing_to_read(config)
        if idle:
            print(f"{config.pipeline.name}: nothing to read: {idle}; nothing started",
                  flush=True)
            return 0
    from ..config.checks import source_refused

    # before the Spark server (half a minute of JVM) and every stage: a wrong password or
    # a missing queue is one line at once, not after the JVM, and not once per restart
    refused = source_refused(config)
    if refused:
        logging.getLogger("offbroadway.sources").error("%s", refused)
        return 1
    import asyncio  # here: the other verbs are clients and start faster without it

    from ..shell.app import START_ERRORS, Daemon

    try:
        return asyncio.run(Daemon(config, until_idle=args.until_idle).run())
    except START_ERRORS as exc:
        logging.getLogger("offbroadway.daemon").error("%s", exc)
        return 1


def _socket(args: argparse.Namespace) -> str:
    if args.socket:
        return args.socket
    if args.config:
        return os.path.join(_load(args.config).runtime.dir, control.CONTROL_SOCKET)
    return os.path.join(os.path.abspath("var/run"), control.CONTROL_SOCKET)


def _call(args: argparse.Namespace, payload: dict, timeout: float = 30.0) -> dict[str, Any]:
    try:
        reply = control.request(_socket(args), payload, timeout)
    except control.ControlError as exc:
        _fail(str(exc))
    if not reply.get("ok"):
        _fail(reply.get("error", "request failed"))
    return reply


def cmd_status(args: argparse.Namespace) -> int:
    status = _call(args, {"cmd": "status"})["status"]
    if args.json:
        print(json.dumps(status))
    else:
        import shutil

        from .render import render_tree
        width = shutil.get_terminal_size((0, 0)).columns if sys.stdout.isatty() else 0
        print(render_tree(status, width=width or None))
    return 0


def _out_counts(tree: dict) -> dict[str, int]:
    """Stage id → messages out, over the whole tree."""
    return {node["id"]: out for node in snapshot_nodes(tree)
            if isinstance(out := node.get("messages", {}).get("out"), int)}


class _Rates:
    """Per-stage output rates between two status answers."""

    def __init__(self) -> None:
        self.previous: dict[str, tuple[float, int]] = {}

    def update(self, status: dict) -> dict[str, float]:
        import time

        now = time.monotonic()
        rates: dict[str, float] = {}
        for sid, out in _out_counts(status["tree"]).items():
            if sid in self.previous and now > self.previous[sid][0]:
                rates[sid] = max(0, out - self.previous[sid][1]) / (now - self.previous[sid][0])
            self.previous[sid] = (now, out)
        return rates


def cmd_top(args: argparse.Namespace) -> int:
    """A live view: the tree every ``--interval`` seconds, with per-stage output rates."""
    import shutil

    from .render import render_tree

    path = _socket(args)
    status = _call(args, {"cmd": "status"})["status"]     # no daemon: say so, exit 1
    rates = _Rates()
    if args.once or not (sys.stdout.isatty() and sys.stdin.isatty()):
        import time

        while True:
            width = shutil.get_terminal_size((0, 0)).columns if sys.stdout.isatty() else 0
            print(render_tree(status, rates.update(status), width or None), flush=True)
            if args.once:
                return 0
            time.sleep(args.interval)
            try:
                status = control.request(path, {"cmd": "status"})["status"]
            except control.ControlError:
                print("offbroadway: the daemon has stopped; top ends", file=sys.stderr)
                return 0
    import curses

    from .top import run_top

    # curses believes LINES/COLUMNS from the environment over the terminal itself, and a
    # stale pair (exported by a shell, inherited through tmux) would fit the view to the
    # wrong size and ignore resizes: ask the terminal
    os.environ.pop("LINES", None)
    os.environ.pop("COLUMNS", None)

    try:
        gone = curses.wrapper(run_top, path, status, rates.update, args.interval)
    except KeyboardInterrupt:
        return 0
    if gone:
        print("offbroadway: the daemon has stopped; top ends")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    """Ask for a stop and, unless ``--no-wait``, wait until the daemon has exited, showing
    what it is doing (as ``supervisorctl stop`` does)."""
    import time

    path = _socket(args)
    reply = _call(args, {"cmd": "stop"})
    pid = reply.get("pid")
    if args.no_wait:
        print("stop: requested (the daemon drains, then exits)")
        return 0
    started = time.monotonic()
    last = ""
    last_shown = 0.0
    try:
        while True:
            try:
                status = control.request(path, {"cmd": "status"}, timeout=10)["status"]
                line = _stop_progress(status)
            except control.ControlError:
                line = "stopping the stages"
                status = None
            if status is None and (pid is None or not _alive(pid)):
                print(f"stop: the daemon has exited ({time.monotonic() - started:.1f}s)")
                return 0
            now = time.monotonic()
            if line != last or now - last_shown >= 5:
                print(f"stop: {line} ({now - started:.0f}s)", file=sys.stderr, flush=True)
                last, last_shown = line, now
            if args.timeout and now - started > args.timeout:
                _fail(f"the daemon is still stopping after {args.timeout:g}s (pid {pid})")
            time.sleep(0.2)
    except KeyboardInterrupt:
        print(f"\noffbroadway: not waiting any more; the daemon goes on stopping (pid {pid})",
              file=sys.stderr)
        return 130


def _stop_progress(status: dict) -> str:
    inflight = 0
    for node in snapshot_nodes(status["tree"]):
        msgs = node.get("messages") or {}
        if role_of(node["id"]) == PRODUCER and isinstance(msgs.get("inflight"), int):
            inflight += msgs["inflight"]
    what = "draining" if status.get("draining") else "stopping"
    return f"{what}, {inflight} messages in flight"


def _alive(pid: int) -> bool:
    """Still running (an exited daemon its parent has not reaped yet is a zombie: gone)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def cmd_simple(verb: str):
    def run(args: argparse.Namespace) -> int:
        payload = {"cmd": verb}
        if verb == "restart":
            payload["child"] = args.child_id
        reply = _call(args, payload)
        print(f"{verb}: {reply.get('message', 'ok')}")
        return 0
    return run


DESCRIPTION = """Run a Broadway-style pipeline of supervised OS processes, check its config,
and steer the running daemon through its control socket."""
CONFIG_HELP = "the pipeline's TOML config file"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("offbroadway")
    except PackageNotFoundError:
        return "unknown"


#: seconds ``scale`` (and ``reload``) wait for the daemon: a shrink waits for what the
#: removed stages hold (bounded by the daemon's shutdown_timeout, then they are restarted out)
SCALE_TIMEOUT = 3600.0


def cmd_reload(args: argparse.Namespace) -> int:
    """Re-read the config: what may change live is applied, anything else refused (one line
    naming the key) with the pipeline untouched.  The same as SIGHUP.  A concurrency
    change is a resize: the answer waits for it, as ``scale`` does."""
    print(f"reload: {_call(args, {'cmd': 'reload'}, SCALE_TIMEOUT)['applied']}")
    return 0


def cmd_rate_limit(args: argparse.Namespace) -> int:
    """Read the running pipeline's rate limit, or change it (``N/SECONDS`` or ``off``)."""
    from offbroadway.stages.flow.ratelimit import parse

    payload: dict[str, Any] = {"cmd": "rate_limit"}
    if args.limit is not None:
        try:
            parse(args.limit)       # a typo is refused here, before the daemon is asked
        except ValueError as exc:
            _fail(str(exc), EXIT_CONFIG)
        payload["limit"] = args.limit
    print(f"rate limit: {describe_rate_limit(_call(args, payload)['rate_limit'])}")
    return 0


def cmd_scale(args: argparse.Namespace) -> int:
    """Resize the running pipeline; waits until the new shape runs (what a shrink removes
    has finished what it held)."""
    from ..core.resize import ResizeRefused, parse

    try:
        parse(args.words)          # a typo is refused here, before the daemon is asked
    except ResizeRefused as exc:
        _fail(f"scale refused: {exc}", EXIT_CONFIG)
    reply = _call(args, {"cmd": "scale", "args": list(args.words)}, SCALE_TIMEOUT)
    print(f"scale: {reply.get('message', 'ok')}")
    return 0


def cmd_dead_letters(args: argparse.Namespace) -> int:
    """List, show or replay the dead letters of the pipeline's source (:mod:`.deadletters`);
    reads the config, needs no running daemon."""
    from . import deadletters as dl

    config = _load(args.config)
    try:
        with dl.open_box(config) as box:
            record = dl.ReplayRecord(config.runtime.state_dir)
            if args.action == "replay":
                lines = dl.replay(box, record, args.reason)
            else:
                sel = dl.select(box, record, args.reason)
                lines = (dl.show(sel, args.limit) if args.action == "show"
                         else dl.describe(config, box, sel, args.reason, record))
    except (dl.DeadLettersError, ImportError, ValueError, OSError) as exc:
        _fail(f"dead-letters: {exc}")
    print("\n".join(lines))
    return 0


def describe_rate_limit(r: dict | None) -> str:
    if not r or r.get("allowed_messages") is None:
        return f"off (throttled {r.get('throttled', 0) if r else 0} times)"
    return (f"{r['allowed_messages']} messages per {r['interval']:g}s, all producers "
            f"together (throttled {r['throttled']} times)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="offbroadway", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"offbroadway {_version()}")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run a pipeline in the foreground",
                         description="Run the pipeline in the foreground until stopped "
                         "(SIGTERM, Ctrl-C or `offbroadway stop`). Everything `check` "
                         "checks is checked first.")
    run.add_argument("config", metavar="CONFIG", help=CONFIG_HELP)
    run.add_argument("--until-idle", action="store_true",
                     help="drain and exit 0 once the source is exhausted and all is acked")
    run.set_defaults(fn=cmd_run)
    check = sub.add_parser("check", help="validate a config (exit 2 on error)",
                           description="Validate a config and everything `run` would refuse "
                           "at start (directories, the source's options, the handler, "
                           "pyspark and Java); exit 2 with one line naming the key.")
    check.add_argument("config", metavar="CONFIG", help=CONFIG_HELP)
    check.set_defaults(fn=cmd_check)
    test = sub.add_parser(
        "test", help="run fixture messages through the pipeline in one process",
        description="Run each fixture message (JSON Lines: a file or a directory of "
        "*.jsonl) through the config's handler, routing, batching and, with [spark], the "
        "conversion to the rows and schema Spark would get; print them and each message "
        "that would fail and why. No processes, no JVM. Exit 0, or 3 when some fail (as "
        "run --until-idle); with --expect, 1 when the rows differ.")
    test.add_argument("config", metavar="CONFIG", help=CONFIG_HELP)
    test.add_argument("fixtures", metavar="FIXTURES", help="a .jsonl file or a directory")
    test.add_argument("--expect", metavar="FILE", help="expected rows (JSON Lines), any order")
    test.set_defaults(fn=cmd_test)
    spark = sub.add_parser("spark", help="Spark datasets: `spark verify|sql|conf CONFIG`")
    spark_sub = spark.add_subparsers(dest="spark_verb", required=True, metavar="COMMAND")
    verify = spark_sub.add_parser(
        "verify", help="count rows, messages, duplicates and commits in each dataset",
        description="Read each batcher's dataset back through Spark and print its rows, "
        "distinct message ids, duplicate rows and commits; exit 1 if any dataset holds a "
        "message twice.")
    verify.add_argument("config", metavar="CONFIG", help=CONFIG_HELP)
    verify.set_defaults(fn=cmd_spark_verify)
    sql = spark_sub.add_parser(
        "sql", help="run a SQL query on the pipeline's datasets",
        description="Open a Spark session on the pipeline's catalog, register each "
        "batcher's output as a view named by its key (a [spark] table is there by its own "
        "name too) and run QUERY. A local catalog admits one JVM: run it while the daemon "
        "is stopped.")
    sql.add_argument("config", metavar="CONFIG", help=CONFIG_HELP)
    sql.add_argument("query", metavar="QUERY", help='e.g. "SELECT count(*) FROM spark"')
    sql.add_argument("--limit", type=int, default=20, help="rows shown (default 20)")
    sql.add_argument("--json", action="store_true", help="one JSON object per row")
    sql.set_defaults(fn=cmd_spark_sql)
    conf = spark_sub.add_parser(
        "conf", help="print a PySpark snippet that opens a session seeing the datasets",
        description="Print Python code that builds a SparkSession with the pipeline's "
        "catalog settings (or its remote) and reads each batcher's output; no token is "
        "printed, the snippet reads it where the config says it is.")
    conf.add_argument("config", metavar="CONFIG", help=CONFIG_HELP)
    conf.set_defaults(fn=cmd_spark_conf)

    def target(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", metavar="CONFIG",
                       help="the running daemon's config (its runtime.dir has the socket)")
        p.add_argument("--socket", help="the running daemon's control socket "
                       "(default: var/run/control.sock)")

    status = sub.add_parser("status", help="show the live supervision tree")
    status.add_argument("--json", action="store_true",
                        help="print the daemon's whole answer as one JSON object")
    target(status)
    status.set_defaults(fn=cmd_status)
    top = sub.add_parser("top", help="a live view of the tree and per-stage rates",
                         description="A live view fitted to the terminal; q quits.")
    top.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                     help="seconds between refreshes (default 1)")
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    target(top)
    top.set_defaults(fn=cmd_top)
    restart = sub.add_parser("restart", help="restart a child or a supervisor subtree")
    restart.add_argument("child_id", metavar="CHILD_ID",
                         help="a child's id as `status` shows it (e.g. batcher_default)")
    target(restart)
    restart.set_defaults(fn=cmd_simple("restart"))
    stop = sub.add_parser("stop", help="drain and stop the daemon; waits until it has exited",
                          description="Drain the pipeline and stop the daemon. Waits until "
                          "the daemon has exited, showing progress.")
    stop.add_argument("--no-wait", action="store_true",
                      help="return as soon as the daemon has the request")
    stop.add_argument("--timeout", type=float, default=0.0, metavar="SECONDS",
                      help="give up waiting after this long, exit 1 (default: wait)")
    target(stop)
    stop.set_defaults(fn=cmd_stop)
    reload = sub.add_parser("reload", help="re-read the config and apply what can change "
                            "live (the same as SIGHUP)")
    target(reload)
    reload.set_defaults(fn=cmd_reload)
    rate = sub.add_parser("rate-limit", help="show or change the pipeline's rate limit")
    rate.add_argument("limit", nargs="?", metavar="N/SECONDS|off",
                      help="e.g. 500/1 for 500 messages a second; off removes the limit")
    target(rate)
    rate.set_defaults(fn=cmd_rate_limit)
    scale = sub.add_parser(
        "scale", help="resize a running pipeline: scale processors N | scale "
        "batch_processors KEY N",
        description="Grow or shrink the running pipeline's processors, or one batcher's "
        "batch processors. What a shrink removes finishes what it holds first; nothing "
        "is lost or handled twice. Waits until the new shape runs.")
    scale.add_argument("words", nargs="*", metavar="processors N | batch_processors KEY N",
                       help="what to resize and the new count")
    target(scale)
    scale.set_defaults(fn=cmd_scale)
    dead = sub.add_parser(
        "dead-letters", help="list, show or replay the messages the source dead-lettered",
        description="The failed messages the pipeline's source kept (the spool's "
        "dead-letter file, RabbitMQ's dead-letter queue, Redis's dead-letter stream, "
        "NATS's dead-letter subject): list them (count, reasons, oldest and newest), show "
        "some, or replay them to the source once the handler is fixed. A replay is "
        "recorded: replaying again does not replay the same letters twice.")
    dead.add_argument("config", metavar="CONFIG", help=CONFIG_HELP)
    dead.add_argument("action", nargs="?", choices=("list", "show", "replay"),
                      default="list", help="list (default), show or replay")
    dead.add_argument("--reason", metavar="TEXT",
                      help="only the letters whose reason contains TEXT")
    dead.add_argument("--limit", type=int, default=10, metavar="N",
                      help="show: how many (default 10)")
    dead.set_defaults(fn=cmd_dead_letters)
    for verb, text in (("drain", "stop fetching, finish what is in flight, stay up"),
                       ("resume", "fetch again after a drain")):
        p = sub.add_parser(verb, help=text)
        target(p)
        p.set_defaults(fn=cmd_simple(verb))
    return parser


def main(argv: list[str] | None = None) -> int:
    # The handler is imported from the daemon's working directory, as `python -m` would
    # (stage processes run with `-m`, which puts the cwd first on sys.path).
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    args = build_parser().parse_args(argv)
    try:
        code = args.fn(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # `status | head`: the reader has what it wanted; stop writing, quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
