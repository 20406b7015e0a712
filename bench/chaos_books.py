"""The chaos run's books: what the daemon's restart counters, log and output should say
after the kills, and what they do say (restart counts, exits classified, rows read back,
supervisors that gave up).  Pure, so tested without processes."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

from offbroadway.supervision.tree import snapshot_nodes
from offbroadway.supervision.tree import walk as walk_specs


def restarts_of(status: dict) -> dict[str, int]:
    return {n["id"]: int(n["restarts"]) for n in snapshot_nodes(status["tree"])
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
