"""Fixtures for the source tests: real spool directories and state dirs under tmp_path."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from offbroadway.stages.sources import get_source
from offbroadway.stages.sources.base import Item, Source

REPO = Path(__file__).resolve().parents[2]


def worker_env() -> dict[str, str]:
    """The environment for helper subprocesses: this checkout first on the import path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


class SpoolDirs:
    """A spool directory and a state directory, plus helpers to fill and read them."""

    def __init__(self, root: Path) -> None:
        self.path = root / "spool"
        self.state = root / "state"
        self.path.mkdir()
        self.state.mkdir()

    def write(self, name: str, lines: Iterable[Any], *, raw: bool = False,
              newline_at_end: bool = True) -> Path:
        """Write a JSON Lines file; ``raw`` lines are written as given (str), not dumped."""
        text = "\n".join(line if raw else json.dumps(line) for line in lines)
        if newline_at_end:
            text += "\n"
        p = self.path / name
        p.write_text(text)
        return p

    def source(self, index: int = 0, count: int = 1, **options: Any) -> Source:
        opts = {"path": str(self.path), "scan_interval": 0, **options}
        src = get_source("spool")(opts, pipeline="test", producer_index=index,
                                  producer_count=count, state_dir=str(self.state))
        src.open()
        return src

    @property
    def done(self) -> Path:
        return self.path / "done"

    @property
    def dead_letter(self) -> Path:
        return self.state / "spool" / "dead-letter.jsonl"


@pytest.fixture
def spool(tmp_path: Path) -> SpoolDirs:
    return SpoolDirs(tmp_path)


def drain(src: Source, n: int = 1000, limit: int = 10_000_000) -> list[Item]:
    """Fetch until a fetch comes back empty."""
    out: list[Item] = []
    while len(out) < limit:
        got = src.fetch(n)
        if not got:
            return out
        assert len(got) <= n
        out.extend(got)
    return out


def keys(items: Iterable[Item]) -> list[tuple[str, int]]:
    return [(meta["file"], meta["line"]) for _, _, meta, _ in items]


def by_key(items: Iterable[Item]) -> dict[tuple[str, int], Item]:
    return {(it[2]["file"], it[2]["line"]): it for it in items}


