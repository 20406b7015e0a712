"""The ``nats`` source's options: parsed and validated once, a pure function of the table.

Kept apart from the I/O so ``offbroadway check`` validates a config without importing the
client library's connection code or touching a server.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ...runtime.redact import mask_url
from ..base import (
    DEFAULT_MAX_MESSAGE_BYTES,
    SourceOptionError,
    option_float,
    option_int,
    option_max_message_bytes,
    option_str,
)
from ..decode import option_decode

NAME = "nats"
DEFAULT_URL = "nats://127.0.0.1:4222"
#: used when ``prefetch = "auto"`` and the daemon did not compute ``auto_prefetch``
DEFAULT_PREFETCH = 50
#: JetStream's own limit on one pull request's batch; a larger window is pulled in parts
MAX_PULL_BATCH = 256

KNOWN_OPTIONS = frozenset({
    "url", "stream", "consumer", "subject", "create_consumer", "prefetch", "auto_prefetch",
    "ack_wait", "max_deliver", "nak_delay", "dead_letter_subject", "connect_timeout",
    "backoff_min", "backoff_max", "pull_timeout", "max_message_bytes", "decode"})


@dataclass(frozen=True)
class NatsSettings:
    """The validated options (see ``docs/sources.md``)."""

    url: str = DEFAULT_URL
    stream: str = ""
    consumer: str = ""
    subject: str | None = None
    create_consumer: bool = True
    prefetch: int = DEFAULT_PREFETCH
    prefetch_auto: bool = True
    ack_wait: float = 30.0
    max_deliver: int = 5
    nak_delay: float = 1.0
    dead_letter_subject: str | None = None
    connect_timeout: float = 5.0
    backoff_min: float = 0.1
    backoff_max: float = 5.0
    pull_timeout: float = 1.0
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    decode: str = "none"

    def failing_in(self) -> str:
        """Where the messages that failed and were nak'ed stay, for the last line of
        ``--until-idle`` ("N message(s) stay in ...")."""
        then = (f"dead-lettered to {self.dead_letter_subject!r}" if self.dead_letter_subject
                else "terminated")
        return (f"stream {self.stream!r}: each failed in this run and was nak'ed for another "
                f"delivery (after max_deliver = {self.max_deliver} deliveries it is {then})")


def _token(key: str, value: str) -> str:
    """Stream and consumer names are single subject tokens in JetStream's API subjects."""
    if any(c in value for c in " \t\r\n.*>"):
        raise SourceOptionError(f"{NAME} source: option {key!r} must not contain spaces, "
                                f"'.', '*' or '>', got {value!r}", key)
    return value


def parse_options(options: Mapping[str, Any], *, pipeline: str = "") -> NatsSettings:
    """Validate every option, raising :class:`SourceOptionError` naming the key."""
    url = option_str(NAME, options, "url", DEFAULT_URL) or DEFAULT_URL
    if urlsplit(url).scheme not in ("nats", "tls"):
        raise SourceOptionError(f"{NAME} source: option 'url' must be a nats:// or tls:// "
                                f"URL, got {mask_url(url)!r}", "url")
    stream = _token("stream", option_str(NAME, options, "stream", None, required=True) or "")
    consumer = option_str(NAME, options, "consumer", None) or pipeline or "offbroadway"
    consumer = _token("consumer", consumer)
    subject = option_str(NAME, options, "subject", None)
    create = options.get("create_consumer", True)
    if not isinstance(create, bool):
        raise SourceOptionError(f"{NAME} source: option 'create_consumer' must be true or "
                                f"false, got {create!r}", "create_consumer")

    prefetch_opt = options.get("prefetch", "auto")
    auto_value = option_int(NAME, options, "auto_prefetch", None, minimum=1)
    if prefetch_opt == "auto":
        prefetch, auto = auto_value or DEFAULT_PREFETCH, True
    elif isinstance(prefetch_opt, int) and not isinstance(prefetch_opt, bool):
        if prefetch_opt < 1:
            raise SourceOptionError(f"{NAME} source: option 'prefetch' must be \"auto\" or at "
                                    f"least 1, got {prefetch_opt}", "prefetch")
        prefetch, auto = prefetch_opt, False
    else:
        raise SourceOptionError(f"{NAME} source: option 'prefetch' must be \"auto\" or an "
                                f"integer, got {prefetch_opt!r}", "prefetch")

    max_deliver = option_int(NAME, options, "max_deliver", 5, minimum=1)
    dead_letter = option_str(NAME, options, "dead_letter_subject", None)
    backoff_min = option_float(NAME, options, "backoff_min", 0.1, minimum=0.001)
    return NatsSettings(
        url=url, stream=stream, consumer=consumer, subject=subject, create_consumer=create,
        prefetch=prefetch, prefetch_auto=auto,
        ack_wait=option_float(NAME, options, "ack_wait", 30.0, minimum=1.0),
        max_deliver=max_deliver or 5,
        nak_delay=option_float(NAME, options, "nak_delay", 1.0, minimum=0.0),
        dead_letter_subject=dead_letter,
        connect_timeout=option_float(NAME, options, "connect_timeout", 5.0, minimum=0.1),
        backoff_min=backoff_min,
        backoff_max=option_float(NAME, options, "backoff_max", 5.0, minimum=backoff_min),
        pull_timeout=option_float(NAME, options, "pull_timeout", 1.0, minimum=0.05),
        max_message_bytes=option_max_message_bytes(NAME, options),
        decode=option_decode(NAME, options))
