"""Resizing a running pipeline: what to change and in which order, as pure functions.

``offbroadway scale processors N``, ``offbroadway scale batch_processors KEY N`` and a
reload that changes a ``concurrency`` all come here.  A request becomes a new config
(:func:`resized`, refused with one line naming the key when it cannot be done live), the
new config becomes a new topology in the one place that builds topologies
(:func:`.topology.build`), and :func:`plan` compares the running topology with the new one
and returns the ordered steps the shell (:mod:`..shell.app`) carries out.  Nothing here touches a
process, so the order is tested without one (``tests/daemon/test_resize.py``).

Why this order:

* **The new pipeline is adopted first** (``adopt``, :func:`.pipeline.adopt`: the one way a
  reload and a resize change the running pipeline).  The supervision tree takes the new
  specs (``change_spec``, OTP's code_change: nothing starts or stops), so from then on any
  restart, a crash's or an operator's, builds the new shape: a crash in the middle of a
  resize neither brings back what was being removed nor forgets what was being added.
  The daemon's records follow at once (the topology that the drain, the reactions and
  status read).  A stage being removed is out of the lists (the drain no longer waits
  for it, nothing new is announced to it) but keeps its role until it is gone, so a
  crash while it leaves is still a loss, requeued as any other.
* **Growing**: each new stage is started (``start``: the supervisor's ``restart_child`` of
  the child the adoption added).  A new processor subscribes to the producers itself;
  the batchers running then are told to subscribe to it (``subscribe``).  A new batch
  processor subscribes to its batcher itself.
* **The sources' windows follow** (``window``): with RabbitMQ or NATS and the prefetch
  ``"auto"``, each producer's window is sized for the whole topology
  (:func:`.topology.auto_prefetch`); a growth widens it before the new stages start (so
  they are fed from their first ask), a shrink narrows it once the leaving stages are gone.
* **Shrinking drains what it removes first**: each leaving stage stops asking, cancels its
  subscriptions, finishes and forwards what it holds (``leave``); once every one has said
  so (``await_left``) each is stopped and forgotten by its supervisor (``remove``:
  ``terminate_child`` + ``delete_child``, a planned stop that restarts nothing, so the
  restart intensities do not count it and nothing is requeued); then the daemon drops its
  records (``forget``).  A batcher forgets a leaving processor when its last cancel
  arrives.  The highest indexes go first, so the ids left are ``0 .. N-1`` as a fresh
  start would name them.

Only processors and batch processors are resized.  With ``partition_by`` a stage's index
is its partition, so a resize would move messages between partitions mid-stream: refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from offbroadway.supervision.tree import SpecTree

from ..config.load import ConfigError
from ..config.names import index_of
from ..config.records import PROCESSOR_KEY, Config, check_socket_paths
from .topology import Topology

USAGE = "offbroadway scale processors N | offbroadway scale batch_processors KEY N"
#: what a resize request can name
TARGETS = ("processors", "batch_processors")

#: the steps, in the vocabulary of the shell (see the module docstring)
ADOPT, START, SUBSCRIBE, LEAVE, AWAIT_LEFT, REMOVE, FORGET, WINDOW = (
    "adopt", "start", "subscribe", "leave", "await_left", "remove", "forget", "window")


class ResizeRefused(ValueError):
    """A request that cannot be carried out; the message is one line for the operator."""


@dataclass(frozen=True)
class Request:
    """Resize ``target`` (processors / batch_processors) of ``key`` to ``count``."""

    target: str
    key: str
    count: int

    @property
    def config_key(self) -> str:
        if self.target == "processors":
            return f"processors.{self.key}.concurrency"
        return f"batchers.{self.key}.concurrency"


@dataclass(frozen=True)
class Step:
    """One step of a resize.  ``stage``: the stage or child concerned; ``supervisor``: its
    supervisor (start, remove); ``peer``: the processor a batcher subscribes to;
    ``stages``: the stages an ``await_left`` or ``forget`` is about; ``count``: a
    producer's new window."""

    op: str
    stage: str = ""
    supervisor: str = ""
    peer: str = ""
    stages: tuple[str, ...] = ()
    count: int = 0


def parse(words: Sequence[str]) -> Request:
    """``processors N`` or ``batch_processors KEY N``, as typed after ``scale``."""
    words = [str(w) for w in words]
    if not words:
        raise ResizeRefused(f"scale what? usage: {USAGE}")
    target, rest = words[0], words[1:]
    if target == "processors":
        if len(rest) != 1:
            raise ResizeRefused(f"scale processors takes one number, the new count "
                                f"(usage: {USAGE})")
        key, raw = PROCESSOR_KEY, rest[0]
    elif target == "batch_processors":
        if len(rest) != 2:
            raise ResizeRefused(f"scale batch_processors takes a batcher key and the new "
                                f"count (usage: {USAGE})")
        key, raw = rest
    else:
        raise ResizeRefused(f"cannot scale {target!r}: only processors and "
                            f"batch_processors can be resized (usage: {USAGE})")
    return Request(target, key, count(raw, f"{target} count"))


def count(raw: object, what: str) -> int:
    """A stage count from the operator: a whole number of at least 1."""
    if isinstance(raw, bool):
        raise ResizeRefused(f"{what} must be a whole number, not {raw!r}")
    if isinstance(raw, int):
        n = raw
    else:
        text = str(raw).strip()
        if not text.lstrip("+-").isdigit():
            raise ResizeRefused(f"{what} must be a whole number, not {str(raw)!r}")
        n = int(text)
    if n < 1:
        raise ResizeRefused(f"{what} must be at least 1, not {n} (a pipeline needs one to "
                            f"run; `offbroadway drain` stops fetching instead)")
    return n


def resized(config: Config, request: Request) -> Config:
    """``config`` with the request's concurrency, or :class:`ResizeRefused` naming the
    key: an unknown batcher key, ``partition_by`` set, socket paths too long."""
    if request.target == "processors":
        proc = config.processors[PROCESSOR_KEY]
        refusal(config, request.config_key)
        new = dataclasses.replace(
            config, processors={**config.processors,
                                PROCESSOR_KEY: dataclasses.replace(proc,
                                                                   concurrency=request.count)})
    else:
        if request.key not in config.batchers:
            have = ", ".join(sorted(config.batchers)) or "none: the pipeline has no batchers"
            raise ResizeRefused(f"no batcher {request.key!r} (batchers: {have})")
        refusal(config, request.config_key)
        b = config.batchers[request.key]
        new = dataclasses.replace(
            config, batchers={**config.batchers,
                              request.key: dataclasses.replace(b, concurrency=request.count)})
    try:
        check_socket_paths(new)
    except ConfigError as exc:
        raise ResizeRefused(f"{request.config_key} {request.count}: {exc}") from None
    return new


def refusal(config: Config, key: str) -> None:
    """Refuse resizing ``key`` (a dotted ``...concurrency``) when it cannot change live."""
    parts = key.split(".")
    if parts[0] == "processors":
        section: object = config.processors[PROCESSOR_KEY]
    else:
        section = config.batchers[parts[1]]
    where = ".".join(parts[:-1])
    if getattr(section, "partition_by", None):
        raise ResizeRefused(f"{key}: {where}.partition_by is set, and a stage's index is its "
                            f"partition: resizing would move messages between partitions "
                            f"mid-stream (restart the daemon to change it)")


def requests(old: Config, new: Config) -> list[Request]:
    """The resizes that take ``old`` to ``new`` (a reload's concurrency changes)."""
    out = []
    a, b = old.processors[PROCESSOR_KEY], new.processors[PROCESSOR_KEY]
    if a.concurrency != b.concurrency:
        out.append(Request("processors", PROCESSOR_KEY, b.concurrency))
    for key, batcher in old.batchers.items():
        if key in new.batchers and new.batchers[key].concurrency != batcher.concurrency:
            out.append(Request("batch_processors", key, new.batchers[key].concurrency))
    return out


def plan(old: Topology, new: Topology) -> list[Step]:
    """The ordered steps from the running topology ``old`` to ``new`` (empty: the same).

    Only processors and batch processors may differ; anything else is a bug of the
    caller's (:class:`ValueError`).
    """
    for what in ("producers", "batchers", "committers"):
        if getattr(old, what) != getattr(new, what):
            raise ValueError(f"a resize cannot change the {what}")
    if old.spark != new.spark:
        raise ValueError("a resize cannot change the Spark server")
    old_tree, new_tree = SpecTree(old.root), SpecTree(new.root)
    added = ([s for s in new.processors if s not in old.processors]
             + [s for s in new.batch_processors if s not in old.batch_processors])
    # the highest indexes leave first: the ids that stay are 0 .. N-1
    leaving = (sorted((s for s in old.processors if s not in new.processors),
                      key=index_of, reverse=True)
               + sorted((s for s in old.batch_processors if s not in new.batch_processors),
                        key=index_of, reverse=True))
    if not added and not leaving:
        return []
    windows = []
    for producer in new.producers:
        before = old.specs[producer].source_options.get("auto_prefetch")
        after = new.specs[producer].source_options.get("auto_prefetch")
        if after is not None and after != before:
            windows.append((after > (before or 0), Step(WINDOW, producer, count=after)))
    steps = [Step(ADOPT)]
    steps += [step for wider, step in windows if wider]
    for stage in added:
        steps.append(Step(START, stage, supervisor=new_tree.parent[stage].id))
    for stage in added:
        if stage in new.processors:
            steps += [Step(SUBSCRIBE, batcher, peer=stage) for batcher in new.batchers]
    if leaving:
        steps += [Step(LEAVE, stage) for stage in leaving]
        steps.append(Step(AWAIT_LEFT, stages=tuple(leaving)))
        steps += [Step(REMOVE, stage, supervisor=old_tree.parent[stage].id)
                  for stage in leaving]
        steps.append(Step(FORGET, stages=tuple(leaving)))
    steps += [step for wider, step in windows if not wider]
    return steps


def change(old: Topology, new: Topology) -> str:
    """What a resize changes, and only that: ``2 -> 4 processors`` or ``spark: 1 -> 3 batch
    processors`` (the whole shape before and after read as if everything had changed)."""
    parts = []
    if len(old.processors) != len(new.processors):
        parts.append(f"{len(old.processors)} -> {len(new.processors)} processors")
    for key, ids in new.by_batcher.items():
        before = len(old.by_batcher.get(key, ()))
        if before != len(ids):
            parts.append(f"{key}: {before} -> {len(ids)} batch processors")
    return "; ".join(parts) or "nothing"


def shape(topology: Topology) -> str:
    """The resizable shape in one line: ``4 processors, batch processors: spark 2``."""
    text = f"{len(topology.processors)} processors"
    if topology.by_batcher:
        per = ", ".join(f"{k} {len(ids)}" for k, ids in topology.by_batcher.items())
        text += f"; batch processors: {per}"
    return text
