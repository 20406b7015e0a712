"""Reading one TOML table of the config: typed lookups that name the dotted key at fault.

The config's sections (:mod:`.load`) are read through :class:`Table`, so every error,
whatever the section, says which key it is about in the same words, and a key the reader
did not ask for is reported as unknown (a typo such as ``batch_sise`` must not silently
fall back to a default), with the known key it is closest to.  Unknown keys are reported
before missing ones: ``[spark] tabel = "x"`` is a typo of ``table``, and "spark.output:
required" would send the user looking for the wrong thing, so a missing required key is
only raised by :meth:`Table.done`, after the check for unknown keys.  Pure: no I/O, no
imports of user code.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Callable

from offbroadway.stages.runtime.redact import mask_value


class ConfigError(ValueError):
    """A config that cannot run; the message starts with the dotted key at fault."""


def _shown(value: Any, name: str = "") -> Any:
    """A rejected value as an error may show it: a URL without its password or token, an
    option named like a secret as ``***`` (:func:`.redact.mask_value`)."""
    return mask_value(value, name)


class Table:
    """One TOML table being read: typed lookups that name the key, and unknown-key checks."""

    def __init__(self, raw: Any, where: str) -> None:
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: must be a table, not {type(raw).__name__}")
        self.raw = raw
        self.where = where
        self.seen: set[str] = set()
        #: required keys found missing: raised by :meth:`done`, after unknown keys
        self.missing: list[str] = []

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def get(self, name: str, types: type | tuple[type, ...], default: Any = None, *,
            required: bool = False, check: Callable[[Any], str | None] | None = None) -> Any:
        self.seen.add(name)
        if name not in self.raw:
            if required:
                self.missing.append(name)
            return default
        value = self.raw[name]
        # bool is an int in Python; a TOML `true` is never a count or a duration
        if isinstance(value, bool) and bool not in _as_tuple(types):
            raise ConfigError(f"{self.key(name)}: expected {_type_names(types)}, got a boolean")
        accepted = _as_tuple(types)
        if float in accepted and int not in accepted:
            accepted = (*accepted, int)       # a TOML `30` is a fine duration
        if not isinstance(value, accepted):
            raise ConfigError(f"{self.key(name)}: expected {_type_names(types)}, "
                              f"got {type(value).__name__} {_shown(value, name)!r}")
        if isinstance(value, int) and float in _as_tuple(types) and int not in _as_tuple(types):
            value = float(value)
        if check is not None:
            problem = check(value)
            if problem:
                raise ConfigError(f"{self.key(name)}: {problem} (got {_shown(value, name)!r})")
        return value

    def table(self, name: str, required: bool = False) -> Table:
        self.seen.add(name)
        if name not in self.raw:
            if required:
                raise ConfigError(f"{self.key(name)}: required section")
            return Table({}, self.key(name))
        return Table(self.raw[name], self.key(name))

    def done(self) -> None:
        """Every key read: an unknown one is an error (with the closest known key), then
        a missing required one."""
        unknown = sorted(set(self.raw) - self.seen)
        if unknown:
            also = f" (also unknown: {', '.join(unknown[1:])})" if unknown[1:] else ""
            raise ConfigError(f"{self.key(unknown[0])}: unknown key"
                              f"{did_you_mean(unknown[0], self.seen)}{also}")
        if self.missing:
            raise ConfigError(f"{self.key(self.missing[0])}: required")


def did_you_mean(name: str, known: Iterable[str], shown: str = "'{}'") -> str:
    """``"; did you mean 'table'?"`` when a known name is close to ``name``, else ``""``
    (``shown``: how the name is written, e.g. ``"[{}]"`` for a section)."""
    import difflib

    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    if not close and "_" in name:      # concurency vs concurrency, batchsize vs batch_size
        close = difflib.get_close_matches(name.replace("_", ""),
                                          [k.replace("_", "") for k in sorted(known)], n=1)
        close = [k for k in sorted(known) if k.replace("_", "") in close][:1]
    return f"; did you mean {shown.format(close[0])}?" if close else ""


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _type_names(types: type | tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "a boolean",
             list: "an array", dict: "a table"}
    return " or ".join(names.get(t, t.__name__) for t in _as_tuple(types))


def positive(v: float) -> str | None:
    return None if v > 0 else "must be greater than 0"


def non_negative(v: float) -> str | None:
    return None if v >= 0 else "must be 0 or more"


def one_of(choices: tuple[str, ...]) -> Callable[[str], str | None]:
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}"


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2,
          "mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3, "t": 1000**4,
          "tb": 1000**4, "tib": 1024**4}


def parse_size(value: int | str) -> int:
    """``1048576``, ``"1MiB"``, ``"512MB"`` → bytes."""
    if isinstance(value, int):
        return value
    m = _SIZE.match(value)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"not a size: {value!r} (use bytes, or e.g. '512MiB', '1GB')")
    return int(float(m.group(1)) * _UNITS[unit])


def size_option(t: Table, name: str) -> int | None:
    value = t.get(name, (int, str))
    if value is None:
        return None
    try:
        n = parse_size(value)
    except ValueError as exc:
        raise ConfigError(f"{t.key(name)}: {exc}") from None
    if n <= 0:
        raise ConfigError(f"{t.key(name)}: must be greater than 0 (got {value!r})")
    return n


def optional_duration(t: Table, name: str, default: float | None) -> float | None:
    """A timeout where 0 means "off"."""
    value = t.get(name, (int, float), default, check=non_negative)
    return float(value) if value else None
