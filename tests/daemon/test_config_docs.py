"""docs/config.md lists every key the config validator accepts, and no other, with the
defaults it applies (issue 17: the docs must match the code)."""

from __future__ import annotations

import json
import re

import pytest
from offbroadway.daemon.config import load as config_mod

from tests.conftest import REPO

DOC = (REPO / "docs" / "config.md").read_text()
#: a config that visits every section (a [spark] section needs a batcher)
FULL = {
    "pipeline": {"name": "p", "handler": "examples.orders:Orders"},
    "producer": {"source": "spool", "options": {"path": "/tmp"}},
    "processors": {"default": {}},
    "batchers": {"b": {}},
    "spark": {"output": "/tmp/out"},
    "metrics": {},
    "runtime": {"dir": "/tmp/ob-docs-run"},
}


def documented() -> dict[str, str]:
    """Dotted key (``batchers.<key>.batch_size``) → its documented default."""
    out: dict[str, str] = {}
    for m in re.finditer(r"^## `\[([a-z.<>]+)\]`\n(.*?)(?=^## |\Z)", DOC, re.M | re.S):
        section, body = m.group(1), m.group(2)
        table = re.search(r"^\| key \| default \| meaning \|\n\|[- |]+\|\n((?:\|.*\n)+)",
                          body, re.M)
        assert table, f"no key table under [{section}]"
        for row in table.group(1).splitlines():
            cells = [c.strip() for c in row.strip("|").split("|")]
            for name in re.findall(r"`([a-z_]+)`", cells[0]):
                out[f"{section}.{name}"] = cells[1]
    return out


def accepted(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The keys the validator reads, recorded while it validates FULL."""
    seen: set[str] = set()
    real_get = config_mod._Table.get

    def get(self, name, *args, **kwargs):
        seen.add(self.key(name))
        return real_get(self, name, *args, **kwargs)

    monkeypatch.setattr(config_mod._Table, "get", get)
    config_mod.validate(json.loads(json.dumps(FULL)))
    return {re.sub(r"^batchers\.b\.", "batchers.<key>.", k) for k in seen}


def test_every_accepted_key_is_documented_and_no_other(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    keys = accepted(monkeypatch)
    docs = set(documented())
    assert keys == docs, (f"accepted, not documented: {sorted(keys - docs)}; "
                          f"documented, not accepted: {sorted(docs - keys)}")


def test_literal_defaults_are_the_validators() -> None:
    """Each default written as one literal is what the validator gives a config that
    leaves the key out."""
    config = config_mod.validate(json.loads(json.dumps(FULL))).config
    holders = {"pipeline": config.pipeline, "producer": config.producer,
               "processors.default": config.processors["default"],
               "batchers.<key>": config.batchers["b"], "spark": config.spark,
               "metrics": config.metrics, "runtime": config.runtime}
    checked = 0
    for dotted, cell in documented().items():
        section, _, name = dotted.rpartition(".")
        m = re.fullmatch(r"`([^`]+)`", cell)
        if not m or name in FULL.get(section, {}):
            continue
        try:
            value = json.loads(m.group(1))
        except ValueError:
            continue
        holder = holders[section]
        actual = holder[name] if isinstance(holder, dict) else getattr(holder, name)
        if isinstance(actual, tuple):    # a record's sequence is a tuple; TOML's an array
            actual = list(actual)
        assert actual == value, (dotted, actual, value)
        checked += 1
    assert checked >= 25, checked
