"""Running whole daemons against a broker, as the pipeline tests of every broker do:
``--until-idle`` to completion, or several side by side on one queue or durable, and what
their handlers wrote (tests/e2e/handlers.py's records)."""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.conftest import REPO, offbroadway_cmd, test_env, wait_until
from tests.e2e.handlers import read_records


def run(config: Path) -> subprocess.CompletedProcess:
    """``offbroadway run CONFIG --until-idle`` to its end."""
    return subprocess.run(offbroadway_cmd("run", str(config), "--until-idle"), cwd=REPO,
                          env=test_env(), capture_output=True, text=True, timeout=240)


def start(config: Path, *args: str) -> subprocess.Popen:
    """``offbroadway run CONFIG ARGS`` in the background (stderr kept for the failure)."""
    return subprocess.Popen(offbroadway_cmd("run", str(config), *args), cwd=REPO,
                            env=test_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def reap(daemon: subprocess.Popen) -> None:
    """Kill a daemon a failed test left running."""
    if daemon.poll() is None:
        daemon.kill()
        daemon.wait(30)


def handled(tmp: Path) -> Counter:
    """Message id → how many times handle_batch wrote it."""
    return Counter(r["id"] for r in read_records(str(tmp / "out"), "batch-"))


def failed(tmp: Path) -> set:
    """The ids handle_failed saw."""
    return {r["id"] for r in read_records(str(tmp / "out"), "failed-")}


def configs_for(parent: Path, names: tuple[str, ...] = ("a", "b"), **options: Any
                ) -> list[tuple[Path, Path]]:
    """A directory under ``parent`` and a config in it per daemon (``options`` are
    :func:`tests.e2e.test_pipeline.make_config`'s), for :func:`side_by_side`."""
    from tests.e2e.test_pipeline import make_config

    out = []
    for name in names:
        tmp = parent / name
        tmp.mkdir()
        out.append((tmp, make_config(tmp, **options)))
    return out


@dataclass
class Side:
    """Daemons running side by side, and their exit codes once stopped."""

    dirs: list[Path]
    procs: list[subprocess.Popen]
    codes: list[int] = field(default_factory=list)


@contextmanager
def side_by_side(configs: list[tuple[Path, Path]]) -> Iterator[Side]:
    """Start a daemon per ``(dir, config)``, wait until every one is up, and SIGTERM them
    all at the end of the block (their exit codes are then in ``codes``)."""
    side = Side([d for d, _ in configs], [start(c) for _, c in configs])
    try:
        for d in side.dirs:      # all consuming before the test publishes anything
            wait_until(lambda t=d: (t / "run" / "control.sock").exists(), timeout=60,
                       message="every daemon up")
        yield side
    finally:
        for p in side.procs:
            p.terminate()
        side.codes = [p.wait(60) for p in side.procs]
