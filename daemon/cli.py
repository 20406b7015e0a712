"""The ``offbroadway`` command: run a pipeline, check a config, steer a running daemon."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from typing import Any, NoReturn

from offbroadway.stages.logs import configure as configure_logging

from . import control

EXIT_CONFIG = 2


def _load(path: str, *, full: bool = False):
    """The validated config, or exit 2 naming the key at fault (the contract of ``check``).

    With ``full``, also everything ``run`` would refuse at start (:func:`config.preflight`:
    directories, the source's options and files, the handler, pyspark and Java); returns
    (config, notes on what only a running daemon can tell).
    """
    from .config import ConfigError, load_config, preflight

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
        print(f"offbroadway: warning: {_one_line(warning)}", file=sys.stderr)
    return (loaded.config, notes) if full else loaded.config


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _fail(message: str, code: int = 1) -> NoReturn:
    print(f"offbroadway: {_one_line(message)}", file=sys.stderr)
    sys.exit(code)


def cmd_check(args: argparse.Namespace) -> int:
    config, notes = _load(args.config, full=True)
    print(f"{args.config}: ok (pipeline {config.pipeline.name})")
    for note in notes:
        print(f"  not checked: {note}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    config, _notes = _load(args.config, full=True)
    configure_logging(config.runtime.log_level, config.runtime.log_format, "daemon")
    from .app import Daemon, RuntimeDirError

    try:
        return asyncio.run(Daemon(config, until_idle=args.until_idle).run())
    except RuntimeDirError as exc:
        logging.getLogger("offbroadway.daemon").error("%s", exc)
        return 1


def _socket(args: argparse.Namespace) -> str:
    if args.socket:
        return args.socket
    if args.config:
        return os.path.join(_load(args.config).runtime.dir, control.CONTROL_SOCKET)
    return os.path.join(os.path.abspath("var/run"), control.CONTROL_SOCKET)


def _call(args: argparse.Namespace, payload: dict) -> dict[str, Any]:
    try:
        reply = control.request(_socket(args), payload)
    except control.ControlError as exc:
        print(f"offbroadway: {exc}", file=sys.stderr)
        sys.exit(1)
    if not reply.get("ok"):
        print(f"offbroadway: {reply.get('error', 'request failed')}", file=sys.stderr)
        sys.exit(1)
    return reply


def cmd_status(args: argparse.Namespace) -> int:
    status = _call(args, {"cmd": "status"})["status"]
    if args.json:
        print(json.dumps({"pipeline": status["pipeline"], "tree": status["tree"]}))
    else:
        from .render import render_tree
        print(render_tree(status))
    return 0


def _out_counts(node: dict, into: dict[str, int] | None = None) -> dict[str, int]:
    """Stage id → messages out, over the whole tree."""
    into = {} if into is None else into
    out = node.get("messages", {}).get("out")
    if isinstance(out, int):
        into[node["id"]] = out
    for child in node.get("children", []):
        _out_counts(child, into)
    return into


def cmd_top(args: argparse.Namespace) -> int:
    """A live view: the tree every ``--interval`` seconds, with per-stage output rates."""
    import time

    from .render import render_tree

    previous: dict[str, tuple[float, int]] = {}
    try:
        while True:
            status = _call(args, {"cmd": "status"})["status"]
            now = time.monotonic()
            rates: dict[str, float] = {}
            for sid, out in _out_counts(status["tree"]).items():
                if sid in previous and now > previous[sid][0]:
                    rates[sid] = max(0, out - previous[sid][1]) / (now - previous[sid][0])
                previous[sid] = (now, out)
            sys.stdout.write("\x1b[H\x1b[2J" + render_tree(status, rates) + "\n")
            sys.stdout.flush()
            if args.once:
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


def cmd_simple(verb: str):
    def run(args: argparse.Namespace) -> int:
        payload = {"cmd": verb}
        if verb == "restart":
            payload["child"] = args.child_id
        _call(args, payload)
        print(f"{verb}: ok")
        return 0
    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="offbroadway", description=__doc__)
    sub = parser.add_subparsers(dest="verb", required=True)
    run = sub.add_parser("run", help="run a pipeline in the foreground")
    run.add_argument("config")
    run.add_argument("--until-idle", action="store_true",
                     help="drain and exit 0 once the source is exhausted and all is acked")
    run.set_defaults(fn=cmd_run)
    check = sub.add_parser("check", help="validate a config (exit 2 on error)")
    check.add_argument("config")
    check.set_defaults(fn=cmd_check)

    def target(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", help="the running daemon's config")
        p.add_argument("--socket", help="the running daemon's control socket")

    status = sub.add_parser("status", help="show the live supervision tree")
    status.add_argument("--json", action="store_true")
    target(status)
    status.set_defaults(fn=cmd_status)
    top = sub.add_parser("top", help="a live view of the tree and per-stage rates")
    top.add_argument("--interval", type=float, default=1.0)
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    target(top)
    top.set_defaults(fn=cmd_top)
    restart = sub.add_parser("restart", help="restart a child or a supervisor subtree")
    restart.add_argument("child_id")
    target(restart)
    restart.set_defaults(fn=cmd_simple("restart"))
    for verb, text in (("stop", "drain and stop the daemon"),
                       ("drain", "stop fetching, finish what is in flight, stay up"),
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
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
