"""Stage ids: the one place they are built and read back (Broadway's ``process_name/2``).

A stage's id names its process in the tree, its unix socket (``<runtime.dir>/<id>.sock``),
its metrics, its log lines and the rows of ``status``, so every part of the daemon must
spell it the same way.  The shapes are::

    producer_<index>
    processor_<key>_<index>
    batcher_<key>
    batch_processor_<key>_<index>
    committer_<key>

A key may itself contain ``_`` (batcher keys are letters, digits, ``_`` and ``-``): the
index is always the last ``_``-separated part, so an id reads back unambiguously.

This module imports nothing, so the config's validation can name the stages' sockets
without building the topology (which imports the config); :mod:`..core.topology` builds every
id of its tree here.
"""

from __future__ import annotations

from typing import NamedTuple

PRODUCER = "producer"
PROCESSOR = "processor"
BATCHER = "batcher"
BATCH_PROCESSOR = "batch_processor"
COMMITTER = "committer"

#: roles whose ids carry a key, and those that carry an index
_KEYED = (PROCESSOR, BATCHER, BATCH_PROCESSOR, COMMITTER)
_INDEXED = (PRODUCER, PROCESSOR, BATCH_PROCESSOR)
#: matched longest first: ``batch_processor_`` before ``batcher_`` and ``processor_``
ROLES = (BATCH_PROCESSOR, PRODUCER, PROCESSOR, BATCHER, COMMITTER)


class StageName(NamedTuple):
    """A stage id read back: its role, its key (None for producers) and its index (None
    for batchers and committers, of which there is one per key)."""

    role: str
    key: str | None
    index: int | None


def stage_id(role: str, key: str | None = None, index: int | None = None) -> str:
    """The id of the stage with that role, key and index; refuses a combination no stage
    has, so a wrong call fails where it is made rather than as an unknown stage later."""
    if role not in ROLES:
        raise ValueError(f"unknown stage role {role!r}")
    if (key is not None) != (role in _KEYED):
        raise ValueError(f"a {role}'s id {'needs' if role in _KEYED else 'has no'} key")
    if (index is not None) != (role in _INDEXED):
        raise ValueError(f"a {role}'s id {'needs' if role in _INDEXED else 'has no'} index")
    if key is not None and not key:
        raise ValueError(f"a {role}'s key is empty")
    if index is not None and index < 0:
        raise ValueError(f"a {role}'s index is negative: {index}")
    parts = [role, *([key] if key is not None else []),
             *([str(index)] if index is not None else [])]
    return "_".join(parts)


def producer_id(index: int) -> str:
    return stage_id(PRODUCER, index=index)


def processor_id(key: str, index: int) -> str:
    return stage_id(PROCESSOR, key, index)


def batcher_id(key: str) -> str:
    return stage_id(BATCHER, key)


def batch_processor_id(key: str, index: int) -> str:
    return stage_id(BATCH_PROCESSOR, key, index)


def committer_id(key: str) -> str:
    return stage_id(COMMITTER, key)


def producer_ids(n: int) -> list[str]:
    """The ids of ``n`` producers, in index order."""
    return [producer_id(i) for i in range(n)]


def processor_ids(key: str, n: int) -> list[str]:
    """The ids of processor ``key``'s ``n`` processors, in index order."""
    return [processor_id(key, i) for i in range(n)]


def batch_processor_ids(key: str, n: int) -> list[str]:
    """The ids of batcher ``key``'s ``n`` batch processors, in index order."""
    return [batch_processor_id(key, i) for i in range(n)]


def pipeline_ids(producers: int, processors: dict[str, int], batchers: dict[str, int],
                 committers: bool) -> list[str]:
    """Every stage id of a pipeline of that shape (``processors`` and ``batchers``: key ->
    concurrency; ``committers``: a Spark sink), in :attr:`..core.topology.Topology.stages`' order.
    The topology's lists are built by the same functions, and the config's validation asks
    this for the socket paths without building the tree."""
    return (producer_ids(producers)
            + [s for key, n in processors.items() for s in processor_ids(key, n)]
            + ([committer_id(key) for key in batchers] if committers else [])
            + [batcher_id(key) for key in batchers]
            + [s for key, n in batchers.items() for s in batch_processor_ids(key, n)])


def parse(sid: str) -> StageName | None:
    """``sid`` read back into role, key and index; None for anything that is not a stage
    id (a supervisor, the ``spark`` child, a malformed id)."""
    for role in ROLES:
        prefix = role + "_"
        if not sid.startswith(prefix):
            continue
        rest = sid[len(prefix):]
        key: str | None = None
        index: int | None = None
        if role in _INDEXED:
            head, _, tail = rest.rpartition("_") if role in _KEYED else ("", "", rest)
            if not (tail.isascii() and tail.isdigit()):
                return None
            index = int(tail)
            rest = head
        if role in _KEYED:
            if not rest:
                return None
            key = rest
        elif rest:
            return None
        return StageName(role, key, index)
    return None


def role_of(sid: str) -> str | None:
    """The role of stage ``sid``; None if ``sid`` is not a stage id."""
    name = parse(sid)
    return name.role if name is not None else None


def key_of(sid: str) -> str | None:
    """The key of stage ``sid``; None for a producer or a non-stage id."""
    name = parse(sid)
    return name.key if name is not None else None


def index_of(sid: str) -> int:
    """The index of stage ``sid``; -1 for a stage without one or a non-stage id."""
    name = parse(sid)
    return name.index if name is not None and name.index is not None else -1
