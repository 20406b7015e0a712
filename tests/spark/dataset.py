"""What Spark wrote, read back for the tests: a dataset's rows, and each message counted
in it.  Read with pyarrow, so what Spark committed and nothing else."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq


def rows(output: Path, batcher: str) -> list[dict]:
    """What Spark committed.  While a writer runs, its ``_temporary`` dirs come and go
    under the listing: read again rather than fail (the final read has no writer)."""
    path = output / batcher
    for _ in range(20):
        if not path.exists():
            return []
        try:
            return pq.read_table(path).to_pylist()
        except FileNotFoundError:
            continue
    raise AssertionError(f"could not list {path} while it was being written")


def ids_counted(output: Path, batcher: str) -> Counter:
    """How many rows of the dataset hold each ``message_id``."""
    return Counter(r["message_id"] for r in rows(output, batcher))


def assert_each_message_exactly_once(found: list[dict], n: int) -> None:
    """Every line is there, once: n rows, n distinct lines, n distinct message ids."""
    ids: dict[int, set[str]] = {}
    for r in found:
        ids.setdefault(r["seq"], set()).add(r["message_id"])
    assert len(ids) == n, f"{n - len(ids)} lines missing"
    assert all(len(v) == 1 for v in ids.values())
    assert len(found) == n, f"{len(found) - n} duplicate rows"
    assert len({r["message_id"] for r in found}) == n


def assert_each_id_once(tmp: Path, ids: set[str], log: str) -> None:
    """Every published id in the dataset (``tmp/dataset``, batcher ``default``), once:
    counted by ``message_id``."""
    found = ids_counted(tmp / "dataset", "default")
    lost = ids - set(found)
    twice = {k: v for k, v in found.items() if v > 1}
    stray = set(found) - ids
    assert not (lost or twice or stray), (
        f"{len(lost)} lost (e.g. {sorted(lost)[:5]}), {len(twice)} written more than once "
        f"({sum(twice.values()) - len(twice)} duplicate rows, e.g. {sorted(twice)[:5]}), "
        f"{len(stray)} not published\n{log[-5000:]}")
