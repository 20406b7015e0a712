"""Human-readable views of the status tree (``status`` and ``top``), fitted to a width.

Pure functions of the status the daemon answers: the CLI decides the width (the terminal's,
or none for ``status`` into a pipe) and how to show the lines.  A narrow terminal drops
the least useful columns first and shortens stage ids, so every stage keeps one line and
the header stays visible (``top`` at 80x24 is the yardstick).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from offbroadway.supervision.tree import snapshot_lineage

#: the id column's width when there is no stage to size it by
MIN_ID = 24


def _mib(n: int | None) -> str:
    return f"{n / 1048576:.1f}M" if n else "-"


def _num(n: Any) -> str:
    """A count in at most 7 characters (the width of the count columns)."""
    if not isinstance(n, int):
        return ""
    if n < 10_000_000:
        return str(n)
    if n < 10_000_000_000:
        return f"{n / 1e6:.1f}M"
    return f"{n / 1e9:.1f}G"


def duration(seconds: float) -> str:
    """``3d04h``, ``1h02m``, ``4m05s``, ``12s``."""
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d{h:02d}h"
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


@dataclass(frozen=True)
class _Column:
    title: str
    width: int
    #: columns with the highest ``drop`` go first when the width is short (0: never)
    drop: int
    value: Callable[[dict, dict[str, float] | None], str]


def _state(node: dict, _rates: Any) -> str:
    msgs = node.get("messages") or {}
    if node["state"] == "running" and msgs.get("source_connected") == 0:
        return "no-source"      # the producer runs; its broker does not answer
    return str(node["state"])


def _rate(node: dict, rates: dict[str, float] | None) -> str:
    r = (rates or {}).get(node["id"])
    return f"{r:.0f}" if r is not None else ""


def _cpu(node: dict, _rates: Any) -> str:
    cpu = node.get("cpu_seconds")
    return f"{cpu:.1f}" if cpu is not None else "-"


COLUMNS = (
    _Column("pid", 7, 3, lambda n, _r: str(n.get("pid") or "-")),
    _Column("state", 9, 0, _state),
    _Column("rst", 3, 2, lambda n, _r: str(n.get("restarts", 0))),
    _Column("rss", 7, 1, lambda n, _r: _mib(n.get("rss_bytes"))),
    _Column("cpu s", 7, 4, _cpu),
    _Column("in", 7, 0, lambda n, _r: _num((n.get("messages") or {}).get("in"))),
    _Column("out", 7, 0, lambda n, _r: _num((n.get("messages") or {}).get("out"))),
    _Column("failed", 7, 0, lambda n, _r: _num((n.get("messages") or {}).get("failed"))),
)
RATE = _Column("out/s", 7, 0, _rate)


def _label(node: dict, depth: int, width: int, indent: int = 2) -> str:
    label = " " * (indent * depth) + node["id"]
    if node["kind"] == "supervisor" and node.get("strategy"):
        long = f"{label} ({node['strategy']})"
        if len(long) <= width:
            label = long
    if len(label) > width:
        label = label[:max(1, width - 1)] + "~"
    return label


def _layout(nodes: list[tuple[dict, int]], columns: list[_Column], width: int
            ) -> tuple[int, list[_Column]]:
    """(indent, columns) so that every stage's id fits whole in ``width``: first drop the
    least useful columns (pid, restarts, cpu), then indent by one space instead of two,
    then give up rss; a supervisor's longer id may still be shortened."""
    def fixed(cols: list[_Column]) -> int:
        return sum(c.width + 1 for c in cols)

    for indent in (2, 1):
        cols = list(columns)
        need = max((len(" " * (indent * d) + n["id"]) for n, d in nodes
                    if n["kind"] != "supervisor"), default=MIN_ID)
        while width - fixed(cols) < need and any(c.drop >= 2 for c in cols):
            cols.remove(max(cols, key=lambda c: c.drop))
        if width - fixed(cols) >= need:
            return indent, cols
    return 1, [c for c in columns if not c.drop]


def header_lines(status: dict) -> list[str]:
    """What the pipeline is doing, before the rows: uptime, books, flags, sources down."""
    flags = "".join(f"  [{f}]" for f in ("stopping", "draining", "paused") if status.get(f))
    line = f"pipeline {status['pipeline']}"
    if "uptime" in status:
        line += f"  up {duration(status['uptime'])}"
    if "acked" in status:
        line += f"  acked {_num(status['acked'])}"
        if status.get("acks_in_doubt"):
            line += f" (+{_num(status['acks_in_doubt'])} in doubt)"
    if "failed" in status:
        line += f"  failed {_num(status['failed'])}"
        if status.get("failing"):
            line += f" ({_num(status['failing'])} back in the queue)"
        if status.get("failed_deliveries", 0) > status["failed"]:
            line += (f"  deliveries failed {_num(status['failed_deliveries'])}, "
                     f"requeued {_num(status.get('requeued_failures', 0))}")
    lines = [line + flags]
    if status.get("failed") and status.get("failed_to"):
        lines.append(f"failed messages: {status['failed_to']}")
    for down in status.get("sources_down") or []:
        lines.append(f"source not connected: {down}")
    for down in status.get("spark_down") or []:
        lines.append(f"Spark {down}")
    rate = status.get("rate_limit")
    if rate and rate.get("allowed_messages") is not None:
        lines.append(f"rate limit {rate['allowed_messages']} per {rate['interval']:g}s  "
                     f"throttled {_num(rate['throttled'])}")
    return lines


def table_lines(status: dict, rates: dict[str, float] | None = None,
                width: int | None = None) -> list[str]:
    """The column titles, then one line per node of the tree (never wider than ``width``)."""
    nodes = [(n, len(above)) for n, above in snapshot_lineage(status["tree"])]
    columns = [*COLUMNS, RATE] if rates is not None else list(COLUMNS)
    indent = 2
    if width is not None:
        indent, columns = _layout(nodes, columns, width)
    longest = max(len(_label(n, d, 10_000, indent)) for n, d in nodes)
    if width is not None:
        id_width = max(4, min(longest, width - sum(c.width + 1 for c in columns)))
    else:
        id_width = longest
    lines = [f"{'id':{id_width}}" + "".join(f" {c.title:>{c.width}}" for c in columns)]
    for node, depth in nodes:
        cells = "".join(f" {c.value(node, rates)[:c.width]:>{c.width}}" for c in columns)
        lines.append(f"{_label(node, depth, id_width, indent):{id_width}}{cells}")
    if width is not None:
        lines = [ln[:width] for ln in lines]
    return lines


def render_tree(status: dict, rates: dict[str, float] | None = None,
                width: int | None = None) -> str:
    """``status``'s text: the header, the table and the time it was taken."""
    lines = header_lines(status) + table_lines(status, rates, width)
    lines.append(time.strftime("%H:%M:%S"))
    if width is not None:
        lines = [ln[:width] for ln in lines]
    return "\n".join(lines)
