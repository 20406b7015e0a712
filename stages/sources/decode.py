"""Payloads to Python values: JSON through msgspec, and the ``decode`` option of the broker
sources.

JSON is parsed by msgspec's decoder (C speed: about three times the lines per second of the
standard library's scanner on the spool's order lines; figures in docs/benchmarks.md).  It
was chosen over orjson because it gives the very values ``json`` gives: orjson turns an
integer beyond 64 bits into a float, silently losing digits.  msgspec is stricter than
``json`` in a few corners: it refuses ``NaN``/``Infinity``, numbers that overflow a double
and lone surrogates, which ``json`` accepts.  So when msgspec refuses a payload, ``json``
decides: what ``json`` took before is still taken, and what neither takes fails with
``json``'s own message, the one the spool has always given for a bad line ("line is not
valid JSON: Expecting value: line 1 column 1 (char 0)").  Bad input is rare; the price of
asking twice is paid only there.

Brokers deliver bytes.  ``decode = "json"`` (RabbitMQ and NATS: the body; Redis: one field
of the entry) gives the handler the parsed value instead; ``"text"`` gives ``str``.  A
payload that does not decode is not lost and not dropped: the message is delivered failed
(a :class:`~.base.FailedItem` says why, ``data`` keeps the raw payload), so it takes the source's
failure policy, which keeps the original (dead-letter exchange, dead-letter stream or
subject).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from .base import FailedItem, Item, SourceOptionError, failure_of

#: values of the ``decode`` option of the ``rabbitmq`` and ``nats`` sources
BODY_DECODES = ("none", "json", "text")
#: what a payload that does not decode raises (``json``'s errors: UnicodeDecodeError and
#: JSONDecodeError are ValueErrors; a deeply nested one exhausts the recursion limit)
DECODE_ERRORS = (ValueError, RecursionError)

#: msgspec's decoder; it raises DecodeError (a ValueError), UnicodeDecodeError or
#: RecursionError for what it refuses
fast_json = msgspec.json.Decoder().decode


def json_value(raw: str | bytes) -> Any:
    """The JSON value of ``raw``; raises one of :data:`DECODE_ERRORS`, with ``json``'s
    message, when it is not JSON (see the module doc for why ``json`` has the last word)."""
    try:
        return fast_json(raw)
    except DECODE_ERRORS:
        return json.loads(raw)


def why_not(exc: BaseException, what: str) -> str:
    """The failure reason for a payload that did not decode: ``<what> is not valid UTF-8``
    or ``... JSON``, with the decoder's own words."""
    kind = "UTF-8" if isinstance(exc, UnicodeDecodeError) else "JSON"
    return f"{what} is not valid {kind}: {exc}"


def _text(raw: bytes) -> str:
    return raw.decode("utf-8")


def body_decoder(kind: str) -> Callable[[bytes], Any] | None:
    """The function a ``decode`` option stands for (None: the body stays bytes)."""
    return {"json": json_value, "text": _text}.get(kind)


def option_decode(source: str, options: Mapping[str, Any],
                  choices: tuple[str, ...] = BODY_DECODES) -> str:
    """The ``decode`` option, ``"none"`` by default; anything else is an error naming it."""
    value = options.get("decode", "none")
    if value not in choices:
        raise SourceOptionError(f"{source} source: option 'decode' must be one of "
                                f"{', '.join(repr(c) for c in choices)}, got {value!r}",
                                "decode")
    return value


def decode_bodies(items: list[Item], decode: Callable[[bytes], Any], what: str = "body"
                  ) -> int:
    """Decode each item's data in place; an item whose data does not decode keeps its raw
    data and becomes a :class:`~.base.FailedItem` (it fails).  Items already failed (an
    oversized body, data ``None``) are left as they are.  Returns how many did not decode."""
    bad = 0
    for i, item in enumerate(items):
        msg_id, data, meta, handle = item
        if data is None or failure_of(item) is not None:
            continue
        try:
            items[i] = (msg_id, decode(data), meta, handle)
        except DECODE_ERRORS as exc:
            items[i] = FailedItem(msg_id, data, meta, handle, why_not(exc, what))
            bad += 1
    return bad
