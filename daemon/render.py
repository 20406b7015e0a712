"""Human-readable views of the status tree (``status`` and ``top``)."""

from __future__ import annotations

import time


def _mib(n: int | None) -> str:
    return f"{n / 1048576:6.1f}M" if n else "      -"


def render_tree(status: dict, rates: dict[str, float] | None = None) -> str:
    lines = [f"pipeline {status['pipeline']}"
             + ("  [draining]" if status.get("draining") else "")
             + ("  [paused]" if status.get("paused") else "")]
    header = (f"{'id':52} {'pid':>7} {'state':10} {'restarts':>8} {'rss':>7} {'cpu s':>7} "
              f"{'in':>9} {'out':>9}")
    if rates is not None:
        header += f" {'out/s':>9}"
    lines.append(header)

    def walk(node: dict, depth: int) -> None:
        label = "  " * depth + node["id"]
        if node["kind"] == "supervisor":
            label += f" ({node.get('strategy')})"
        msgs = node.get("messages", {})
        cpu = node.get("cpu_seconds")
        line = (f"{label:52} {node.get('pid') or '-':>7} {node['state']:10} "
                f"{node.get('restarts', 0):>8} {_mib(node.get('rss_bytes'))} "
                f"{(f'{cpu:7.1f}' if cpu is not None else '      -')} "
                f"{msgs.get('in', ''):>9} {msgs.get('out', ''):>9}")
        if rates is not None:
            r = rates.get(node["id"])
            line += f" {(f'{r:9.0f}' if r is not None else ''):>9}"
        lines.append(line)
        for child in node.get("children", []):
            walk(child, depth + 1)

    walk(status["tree"], 0)
    lines.append(time.strftime("%H:%M:%S"))
    return "\n".join(lines)
