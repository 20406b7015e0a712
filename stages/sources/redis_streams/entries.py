"""A stream entry as redis-py returns it, read for the producer: ids and fields as text
where they are UTF-8, and an entry's size for ``max_message_bytes``."""

from __future__ import annotations

from typing import Any, NamedTuple

from ..decode import DECODE_ERRORS, json_value, why_not


class RedisHandle(NamedTuple):
    """Entry id plus the raw field map, so a failure can be dead-lettered verbatim."""

    id: str
    fields: dict


def text(value: Any) -> Any:
    """bytes → str when it is valid UTF-8 (the common case), else the bytes unchanged."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return value
    return value


def field_map(fields: dict) -> dict:
    """The entry's fields as the handler sees them (:func:`text` on names and values)."""
    return {text(k): text(v) for k, v in fields.items()}


def json_field(fields: dict, name: str, meta: dict) -> tuple[Any, str | None]:
    """``decode = "json"``: the JSON value of field ``name`` and None; the other fields go
    to ``meta["fields"]``.  An entry without that field, or whose field is not JSON, keeps
    its field map as data, with the reason it fails (the source hands it over as a
    ``FailedItem``), to be dead-lettered whole."""
    raw = fields.get(name.encode(), fields.get(name))
    rest = {text(k): text(v) for k, v in fields.items() if text(k) != name}
    if rest:
        meta["fields"] = rest
    if raw is None:
        return field_map(fields), f"entry has no field {name!r} to decode (decode = \"json\")"
    try:
        return json_value(raw), None
    except DECODE_ERRORS as exc:
        return field_map(fields), why_not(exc, f"field {name!r}")


def id_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def entry_size(fields: dict) -> int:
    """An entry's size for ``max_message_bytes``: its field names and values, in bytes."""
    return sum(len(k) + len(v) if isinstance(k, bytes) and isinstance(v, bytes)
               else len(str(k).encode()) + len(str(v).encode()) for k, v in fields.items())
