"""What one spool line's JSON decode costs, and what the spool source's fetch costs per line.

    .venv/bin/python bench/spool_decode.py [--lines 500000] [--rounds 5] [--baseline TREE]

The lines are the order lines of ``bench/spark_e2e.py`` (``{"order", "sku", "qty",
"unit_price"}``, like ``examples/spool``), the spool source's hot path in the README's job.

Per round, interleaved:

* **decoders**, in this process, on the lines as ``str`` (as the spool holds them): a loop
  of ``json.loads``; json's C scanner ``scan_once(line, 0)`` with the end check (what the
  spool used until msgspec); ``msgspec.json.Decoder().decode`` (what it uses now, through
  ``offbroadway.stages.sources.decode.fast_json``); ``orjson.loads`` when it is installed.
* **spool fetch**: a fresh ``SpoolSource`` over one file of the lines, ``fetch(1000)`` until
  it is exhausted (reading, splitting, decoding, the in-flight table: everything the
  producer pays per line before sending), in a child process.  With ``--baseline TREE`` (a
  checkout of an older commit, e.g. ``git worktree add --detach /tmp/base <commit>``) the
  same child also runs against that tree's code, interleaved, for a before/after figure.

Prints ns per line per round and the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spark_e2e import order_lines, write_spool  # bench/ helpers

REPO = Path(__file__).resolve().parent.parent


def decoders() -> dict:
    import msgspec

    scan = json.JSONDecoder().scan_once

    def scanner(lines: list[str]) -> None:
        for raw in lines:
            _data, stop = scan(raw, 0)
            if stop != len(raw):
                raise ValueError(raw)

    def loop(fn):
        def run(lines: list[str]) -> None:
            for raw in lines:
                fn(raw)
        return run

    out = {"json.loads": loop(json.loads), "json scan_once (before)": scanner,
           "msgspec (now)": loop(msgspec.json.Decoder().decode)}
    try:
        import orjson
    except ImportError:
        pass
    else:
        out["orjson"] = loop(orjson.loads)
    return out


def time_decoder(fn, lines: list[str]) -> float:
    started = time.perf_counter()
    fn(lines)
    return (time.perf_counter() - started) / len(lines) * 1e9


def fetch_child(path: str) -> None:
    """In the child: fetch every line of the spool at ``path``; print ns per line."""
    from offbroadway.stages.sources import get_source

    with tempfile.TemporaryDirectory(prefix="ob-bench-") as state:
        src = get_source("spool")({"path": path, "scan_interval": 0}, pipeline="bench",
                                  state_dir=state)
        src.open()
        n = 0
        started = time.perf_counter()
        while got := src.fetch(1000):
            n += len(got)
        elapsed = time.perf_counter() - started
        src.close()
    print(json.dumps({"lines": n, "ns_per_line": elapsed / n * 1e9}))


def baseline_path(tree: Path, into: Path) -> Path:
    """An import root where ``offbroadway`` is ``tree``'s code, laid out as setup.cfg's
    ``package_dir`` installs it (api/ as the package, the three code folders beneath)."""
    pkg = into / "offbroadway"
    pkg.mkdir(parents=True)
    for f in (tree / "api").iterdir():
        if f.suffix == ".py":
            (pkg / f.name).symlink_to(f)
    for sub in ("daemon", "supervision", "stages"):
        (pkg / sub).symlink_to(tree / sub)
    return into


def run_fetch(path: Path, pythonpath: Path | None) -> float:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    out = subprocess.run([sys.executable, __file__, "--fetch-child", str(path)], env=env,
                         capture_output=True, text=True, check=True, cwd="/")
    return json.loads(out.stdout)["ns_per_line"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=500_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--baseline", type=Path, help="a checkout to compare the spool fetch with")
    ap.add_argument("--fetch-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.fetch_child:
        fetch_child(args.fetch_child)
        return 0
    lines = order_lines(args.lines)
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="ob-bench-") as tmp:
        spool = Path(tmp) / "spool"
        write_spool(spool, lines, files=1)
        base = baseline_path(args.baseline.resolve(), Path(tmp) / "base") \
            if args.baseline else None
        fns = decoders()
        print(f"{args.lines} order lines, {args.rounds} rounds; load "
              f"{os.getloadavg()[0]:.1f}", flush=True)
        for r in range(args.rounds):
            row = {}
            for name, fn in fns.items():
                row[f"decode: {name}"] = time_decoder(fn, lines)
            row["spool fetch: this tree"] = run_fetch(spool, None)
            if base is not None:
                row["spool fetch: baseline"] = run_fetch(spool, base)
            for k, v in row.items():
                results.setdefault(k, []).append(v)
            print(f"round {r + 1} (load {os.getloadavg()[0]:.1f}): " +
                  ", ".join(f"{k} {v:.0f}" for k, v in row.items()), flush=True)
    print("\nmedian ns per line:")
    for k, vs in results.items():
        print(f"  {k:32s} {statistics.median(vs):8.0f}")
    if base is not None:
        ratio = statistics.median(results["spool fetch: baseline"]) / \
            statistics.median(results["spool fetch: this tree"])
        print(f"  spool fetch, baseline / this tree: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
