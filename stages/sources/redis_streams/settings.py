"""The ``redis`` source's options, validated (pure: what ``offbroadway check`` uses); each
default is written here once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...runtime.redact import mask_url
from ..base import option_float, option_int, option_max_message_bytes, option_str
from ..decode import option_decode

NAME = "redis"
DEFAULT_URL = "redis://127.0.0.1:6379/0"
ON_FAILURE = ("dead_letter", "leave_pending")
KNOWN_OPTIONS = frozenset({
    "url", "stream", "group", "consumer", "create_group", "start_id", "block_ms",
    "poll_ms", "claim_idle_ms", "on_failure", "dead_letter_stream",
    "dead_letter_maxlen", "backoff_min", "backoff_max", "socket_timeout",
    "max_message_bytes", "decode", "decode_field"})
#: values of ``decode``: the field map as it is, or one field's JSON value
DECODES = ("none", "json")


@dataclass(frozen=True)
class RedisSettings:
    """The validated options; ``None`` where the default depends on where the source runs
    (``group``: the pipeline's name; ``consumer``: a stable name per daemon and producer;
    ``dead_letter_stream``: ``<stream>:dead``)."""

    url: str
    stream: str
    group: str | None
    consumer: str | None
    create_group: bool
    start_id: str
    block_ms: int
    poll_ms: int
    claim_idle_ms: int
    on_failure: str
    dead_letter_stream: str | None
    dead_letter_maxlen: int | None
    socket_timeout: float
    max_message_bytes: int
    backoff_min: float
    backoff_max: float
    decode: str = "none"
    decode_field: str = "data"


def parse_options(options: Mapping[str, Any]) -> RedisSettings:
    """Validate every option, raising ``ValueError`` (a ``SourceOptionError`` where the
    helpers can) that names the key; unknown names are the base class's check."""
    n = NAME
    url = option_str(n, options, "url", DEFAULT_URL) or DEFAULT_URL
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"{n} source: option 'url' must be a redis://, rediss:// or "
                         f"unix:// URL, got {mask_url(url)!r}")
    create_group = options.get("create_group", True)
    if not isinstance(create_group, bool):
        raise ValueError(f"{n} source: option 'create_group' must be true or false")
    on_failure = options.get("on_failure", "dead_letter")
    if on_failure not in ON_FAILURE:
        raise ValueError(f"{n} source: option 'on_failure' must be one of "
                         f"{', '.join(ON_FAILURE)}, got {on_failure!r}")
    backoff_min = option_float(n, options, "backoff_min", 0.05, minimum=0.001)
    return RedisSettings(
        url=url,
        stream=option_str(n, options, "stream", None, required=True) or "",
        group=option_str(n, options, "group", None),
        consumer=option_str(n, options, "consumer", None),
        create_group=create_group,
        start_id=option_str(n, options, "start_id", "0") or "0",
        block_ms=option_int(n, options, "block_ms", 0, minimum=0) or 0,
        poll_ms=option_int(n, options, "poll_ms", 50, minimum=1) or 50,
        claim_idle_ms=option_int(n, options, "claim_idle_ms", 60_000, minimum=0) or 0,
        on_failure=on_failure,
        dead_letter_stream=option_str(n, options, "dead_letter_stream", None),
        dead_letter_maxlen=option_int(n, options, "dead_letter_maxlen", None, minimum=1),
        socket_timeout=option_float(n, options, "socket_timeout", 5.0, minimum=0.1),
        max_message_bytes=option_max_message_bytes(n, options),
        backoff_min=backoff_min,
        backoff_max=option_float(n, options, "backoff_max", 5.0, minimum=backoff_min),
        decode=option_decode(n, options, DECODES),
        decode_field=option_str(n, options, "decode_field", "data") or "data")
