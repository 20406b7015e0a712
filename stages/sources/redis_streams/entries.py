"""A stream entry as redis-py returns it, read for the producer: ids and fields as text
where they are UTF-8, and an entry's size for ``max_message_bytes``."""

from __future__ import annotations

from typing import Any, NamedTuple


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


def id_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def entry_size(fields: dict) -> int:
    """An entry's size for ``max_message_bytes``: its field names and values, in bytes."""
    return sum(len(k) + len(v) if isinstance(k, bytes) and isinstance(v, bytes)
               else len(str(k).encode()) + len(str(v).encode()) for k, v in fields.items())
