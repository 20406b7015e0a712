"""Reload: what may change in a running pipeline, as a pure comparison of two configs.

SIGHUP (systemd's ``ExecReload=``) and ``offbroadway reload`` re-read the config file.
What can be applied live is applied; anything else refuses the whole reload with one line
naming the first key that differs, and the running pipeline is left exactly as it was
(a half-applied reload would leave a config on disk that describes no running state).

Live keys, and why only these: each is read by one stage at a time and can change between
two messages without breaking a promise: the rate limit (the shared bucket), the log level
(every process), and a batcher's ``batch_size`` and ``batch_timeout`` (the next batch
uses them).  The processors' and batch processors' ``concurrency`` resize the running
tree the way ``offbroadway scale`` does (:mod:`.resize`: what leaves drains first),
unless ``partition_by`` ties a stage's index to a partition.  The handler, the source and
its options, the sink and the directories change what a message means or where it goes,
so they need a restart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from offbroadway.stages.runtime.redact import MASK, mask_value

from ..config.records import PROCESSOR_KEY, Config
from . import resize

#: the keys a reload applies (``<key>`` is any batcher)
LIVE_KEYS = ("producer.rate_limit", "runtime.log_level", "batchers.<key>.batch_size",
             "batchers.<key>.batch_timeout", f"processors.{PROCESSOR_KEY}.concurrency",
             "batchers.<key>.concurrency")
_WHY = {
    "concurrency": "the producers' number cannot change while the pipeline runs (each "
                   "owns a share of the source; restart the daemon to apply it)",
}


class ReloadRefused(ValueError):
    """The new config differs in a key that cannot change live; the message names it."""


@dataclass
class Plan:
    """What a reload changes: ``(dotted key, old, new)`` for every live key that differs."""

    changes: list[tuple[str, Any, Any]] = field(default_factory=list)

    def describe(self) -> str:
        if not self.changes:
            return "nothing to change"
        return ", ".join(f"{k} {_shown(o)} -> {_shown(n)}" for k, o, n in self.changes)


def _shown(value: Any) -> str:
    if value is None:
        return "off"
    if isinstance(value, tuple) and len(value) == 2:
        return f"{value[0]}/{value[1]:g}s"
    return repr(value)


def _fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


_ABSENT = "absent"


def differences(key: str, old: Any, new: Any) -> list[tuple[str, Any, Any]]:
    """``(dotted key, old, new)`` of every leaf that differs: a table (a source's
    options) is named down to the key that changed (``producer.options.queue``)."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out = []
        for k in list(old) + [k for k in new if k not in old]:
            a, b = old.get(k, _ABSENT), new.get(k, _ABSENT)
            if a != b:
                out += differences(f"{key}.{k}", a, b)
        return out
    return [(key, old, new)]


def _refuse(key: str, old: Any, new: Any) -> ReloadRefused:
    """The refusal, naming every key that changed, with the values masked as every
    surface shows config values (:func:`~offbroadway.stages.runtime.redact.mask_value`):
    the line goes to the CLI, the log and the live page."""
    diffs = differences(key, old, new) or [(key, old, new)]
    leaf = key.rsplit(".", 1)[-1]
    why = _WHY.get(leaf, "cannot change while the pipeline runs (restart the daemon to "
                         "apply it)")
    names = ", ".join(k for k, _, _ in diffs)
    if len(diffs) == 1:
        _, a, b = diffs[0]
        values = f"running {_masked(diffs[0][0], a)}, config {_masked(diffs[0][0], b)}"
    else:
        values = "; ".join(f"{k.rsplit('.', 1)[-1]}: running {_masked(k, a)}, config "
                           f"{_masked(k, b)}" for k, a, b in diffs)
    return ReloadRefused(f"{names}: {why} ({values}); nothing was changed")


def _masked(key: str, value: Any) -> str:
    shown = mask_value(value, key.rsplit(".", 1)[-1])
    return shown if shown == MASK else repr(shown)


def keep_live(file_before: Config, file_now: Config, running: Config) -> Config:
    """The config a reload applies: the file's, except the concurrencies the file did not
    change since it was last read, which keep their running values.  ``offbroadway scale``
    changes the running shape and not the file; a reload for an unrelated key (a log
    level) must not undo it, while a reload that changed that key in the file applies the
    file's value."""
    procs = dict(file_now.processors)
    now, was = file_now.processors[PROCESSOR_KEY], file_before.processors[PROCESSOR_KEY]
    if now.concurrency == was.concurrency:
        procs[PROCESSOR_KEY] = dataclasses.replace(
            now, concurrency=running.processors[PROCESSOR_KEY].concurrency)
    batchers = {}
    for key, b in file_now.batchers.items():
        if key in file_before.batchers and key in running.batchers \
                and b.concurrency == file_before.batchers[key].concurrency:
            b = dataclasses.replace(b, concurrency=running.batchers[key].concurrency)
        batchers[key] = b
    return dataclasses.replace(file_now, processors=procs, batchers=batchers)


def plan(old: Config, new: Config) -> Plan:
    """The live changes from ``old`` to ``new``, or :class:`ReloadRefused` naming the first
    key that differs and cannot change live."""
    out = Plan()
    sections: list[tuple[str, Any, Any, tuple[str, ...]]] = [
        ("pipeline", old.pipeline, new.pipeline, ()),
        ("producer", old.producer, new.producer, ("rate_limit",)),
        (f"processors.{PROCESSOR_KEY}", old.processors[PROCESSOR_KEY],
         new.processors[PROCESSOR_KEY], ("concurrency",)),
        ("metrics", old.metrics, new.metrics, ()),
        ("runtime", old.runtime, new.runtime, ("log_level",)),
    ]
    added = sorted(set(new.batchers) ^ set(old.batchers))
    if added:
        key = added[0]
        raise _refuse(f"batchers.{key}", "present" if key in old.batchers else "absent",
                      "present" if key in new.batchers else "absent")
    for key in old.batchers:
        sections.append((f"batchers.{key}", old.batchers[key], new.batchers[key],
                         ("batch_size", "batch_timeout", "concurrency")))
    for where, a, b, live in sections:
        fa, fb = _fields(a), _fields(b)
        for name, value in fa.items():
            if fb[name] == value:
                continue
            if name in live:
                if name == "concurrency":
                    try:
                        resize.refusal(old, f"{where}.{name}")
                    except resize.ResizeRefused as exc:
                        raise ReloadRefused(f"{exc} (running {value!r}, config "
                                            f"{fb[name]!r}); nothing was changed") from None
                out.changes.append((f"{where}.{name}", value, fb[name]))
            elif name == "upstream_demand" and _derived_demand(a) and _derived_demand(b):
                continue     # follows batch_size by default; the running value stays
            else:
                raise _refuse(f"{where}.{name}", value, fb[name])
    if old.spark != new.spark:
        was = asdict(old.spark) if old.spark else {}
        now = asdict(new.spark) if new.spark else {}
        key = next(k for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k))
        raise _refuse(f"spark.{key}", was.get(key), now.get(key))
    return out


def _derived_demand(b: Any) -> bool:
    """``upstream_demand`` is its default for this batch size (not set by the user)."""
    return not b.batch_bytes and b.upstream_demand == max(1000, 2 * b.batch_size)
