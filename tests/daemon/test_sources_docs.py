"""docs/sources.md documents every option each built-in source accepts, and no other, with
the default the code uses (issue 17: the docs must match the code)."""

from __future__ import annotations

import json
import re

import pytest
from offbroadway.stages.sources import get_source

from tests.conftest import REPO

DOC = (REPO / "docs" / "sources.md").read_text()
#: what each source needs to be constructed (no connection is made by a constructor)
REQUIRED = {"spool": {"path": "/tmp"}, "generator": {}, "rabbitmq": {"queue": "q"},
            "redis": {"stream": "s"}, "nats": {"stream": "S"}}
#: options set by the daemon, not by the user (documented all the same)
DAEMON_SET = {"auto_prefetch"}


def option_table(source: str) -> dict[str, str]:
    """Option name → its documented default, from the first table under ``## `source```."""
    section = re.search(rf"^## `{source}`\n(.*?)(?=^## )", DOC, re.M | re.S)
    assert section, f"docs/sources.md has no section ## `{source}`"
    table = re.search(r"^\| option \| default \| meaning \|\n\|[- |]+\|\n((?:\|.*\n)+)",
                      section.group(1), re.M)
    assert table, f"no option table in the {source} section"
    out = {}
    for row in table.group(1).splitlines():
        cells = [c.strip() for c in row.strip("|").split("|")]
        for name in re.findall(r"`([a-z_]+)`", cells[0]):
            out[name] = cells[1]
    return out


@pytest.mark.parametrize("source", sorted(REQUIRED))
def test_documented_options_are_the_accepted_ones(source: str) -> None:
    cls = get_source(source)
    documented = set(option_table(source))
    assert cls.known_options is not None
    assert documented == set(cls.known_options), (
        f"{source}: documented but not accepted: {sorted(documented - cls.known_options)}; "
        f"accepted but not documented: {sorted(cls.known_options - documented)}")


def _literal(cell: str):
    """The default cell as a value, when it is one literal (`1.0`, `"x"`, `true`)."""
    m = re.fullmatch(r"`([^`]+)`(?: \(.*\))?", cell)
    if not m:
        return None, False
    try:
        return json.loads(m.group(1)), True
    except ValueError:
        return None, False


@pytest.mark.parametrize("source", sorted(REQUIRED))
def test_documented_defaults_are_the_codes(source: str) -> None:
    """Every literal default in the table is what a source built without that option uses
    (read from the instance or its settings, where the code keeps it under that name)."""
    cls = get_source(source)
    instance = cls(dict(REQUIRED[source]), pipeline="p", producer_index=0, producer_count=1,
                   state_dir="/tmp/ob-docs-state")
    holders = [instance, getattr(instance, "settings", None)]
    checked = 0
    for name, cell in option_table(source).items():
        if name in REQUIRED[source] or name in DAEMON_SET:
            continue
        value, is_literal = _literal(cell)
        if not is_literal:
            continue
        for holder in holders:
            if holder is not None and hasattr(holder, name):
                actual = getattr(holder, name)
                auto_flag = f"{name.removesuffix('_count')}_auto"
                if value == "auto" and getattr(holder, auto_flag, False):
                    pass                            # "auto": resolved, and flagged as such
                elif isinstance(value, str) and name in ("done_dir",):
                    assert str(actual).endswith("/" + value), (source, name, actual)
                elif isinstance(actual, tuple):
                    assert list(actual) == value, (source, name, actual, value)
                else:
                    assert actual == value, (source, name, actual, value)
                checked += 1
                break
    assert checked >= 1, f"{source}: no documented default could be checked"
