"""The ``rabbitmq`` source's options, validated (pure: what ``offbroadway check`` uses).

Failure policies (``on_failure``): ``reject_and_requeue``, the default as in
BroadwayRabbitMQ (basic.reject requeue=true: nothing is dropped; ``requeue`` is its older
name), ``reject`` (requeue=false: the queue's dead-letter exchange gets it, or the broker
drops it if there is none), and ``reject_and_requeue_once`` (requeue a first delivery,
reject a redelivered one).  The requeuing policies never requeue a message that would only
fail again (poison, oversized, not decodable): see :mod:`.settle`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ...runtime.redact import mask_url
from ..base import (
    DEFAULT_MAX_MESSAGE_BYTES,
    option_float,
    option_int,
    option_max_message_bytes,
    option_str,
)
from ..decode import option_decode

NAME = "rabbitmq"
DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
#: used when ``prefetch_count = "auto"`` and the daemon did not compute ``auto_prefetch``
DEFAULT_PREFETCH = 50
#: basic.qos prefetch_count is a 16-bit field
AMQP_MAX_PREFETCH = 65535
ON_FAILURE = ("reject_and_requeue", "reject", "reject_and_requeue_once", "requeue")
#: the policies that send every failed message back to the queue (``requeue``: the old name)
ALWAYS_REQUEUE = ("reject_and_requeue", "requeue")
ON_SUCCESS = ("ack",)
KNOWN_OPTIONS = frozenset({
    "url", "queue", "declare", "bindings", "prefetch_count", "auto_prefetch",
    "on_success", "on_failure", "heartbeat", "connect_timeout", "backoff_min",
    "backoff_max", "max_message_bytes", "decode", "dead_letter_queue"})


@dataclass(frozen=True)
class RabbitMQSettings:
    """The validated options (see ``docs/sources.md``)."""

    url: str = DEFAULT_URL
    queue: str = ""
    declare: bool = False
    durable: bool = True
    auto_delete: bool = False
    queue_arguments: dict = field(default_factory=dict)
    bindings: tuple[tuple[str, str, dict], ...] = ()
    prefetch_count: int = DEFAULT_PREFETCH
    prefetch_auto: bool = True
    on_success: str = "ack"
    on_failure: str = "reject_and_requeue"
    heartbeat: int = 30
    connect_timeout: float = 5.0
    backoff_min: float = 0.1
    backoff_max: float = 10.0
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    decode: str = "none"
    #: the queue bound to the dead-letter exchange, where ``offbroadway dead-letters``
    #: reads and replays from (AMQP cannot tell which queue that is)
    dead_letter_queue: str | None = None

    def failed_to(self) -> str:
        """Where a failed message goes, in the words of the summary line."""
        if self.on_failure in ("reject_and_requeue", "requeue"):
            return (f"requeued to queue {self.queue!r} (on_failure = {self.on_failure}; "
                    f"poison, oversized and undecodable ones rejected: to the queue's "
                    f"dead-letter exchange if it has one, else dropped by the broker)")
        once = "requeued once, then " if self.on_failure == "reject_and_requeue_once" else ""
        return (f"{once}rejected: to the dead-letter exchange of queue {self.queue!r} if it "
                f"has one, else dropped by the broker")


    def failing_in(self) -> str:
        """Where the messages that failed and were requeued stay, for the last line of
        ``--until-idle`` ("N message(s) stay in ...")."""
        return (f"queue {self.queue!r}: each failed in this run and on_failure = "
                f"{self.on_failure} sends it back (delivered again at the next run; "
                f"on_failure = \"reject\" with a dead-letter exchange sets them aside)")

    def drops_failures(self) -> str | None:
        """A warning when this config certainly lets the broker drop failed messages: a
        rejecting policy on a queue it declares without a dead-letter exchange (a queue it
        does not declare may have one, by its arguments or a policy: not knowable here)."""
        if self.on_failure in ALWAYS_REQUEUE or not self.declare \
                or "x-dead-letter-exchange" in self.queue_arguments:
            return None
        return (f"{NAME} source: on_failure = {self.on_failure!r} and the queue "
                f"{self.queue!r} is declared without x-dead-letter-exchange: the broker will "
                f"drop failed messages (declare it with a dead-letter exchange, or keep the "
                f"default on_failure = \"reject_and_requeue\")")


def parse_options(options: Mapping[str, Any]) -> RabbitMQSettings:
    """Validate every option, raising ``ValueError`` that names the offending key."""
    name = NAME
    url = option_str(name, options, "url", DEFAULT_URL) or DEFAULT_URL
    if urlsplit(url).scheme not in ("amqp", "amqps"):
        raise ValueError(f"{name} source: option 'url' must be an amqp:// or amqps:// URL, "
                         f"got {mask_url(url)!r}")
    queue = option_str(name, options, "queue", None, required=True) or ""

    declare_opt = options.get("declare", False)
    declare, durable, auto_delete, arguments = False, True, False, {}
    if isinstance(declare_opt, bool):
        declare = declare_opt
    elif isinstance(declare_opt, Mapping):
        declare = True
        arguments = dict(declare_opt)
        for flag in ("durable", "auto_delete"):
            if flag in arguments and not isinstance(arguments[flag], bool):
                raise ValueError(f"{name} source: option 'declare.{flag}' must be true or "
                                 f"false, got {arguments[flag]!r}")
        durable = arguments.pop("durable", True)
        auto_delete = arguments.pop("auto_delete", False)
    else:
        raise ValueError(
            f"{name} source: option 'declare' must be true, false or a table of queue "
            f"arguments, got {declare_opt!r}")

    bindings: list[tuple[str, str, dict]] = []
    raw_bindings = options.get("bindings", [])
    if not isinstance(raw_bindings, (list, tuple)):
        raise ValueError(
            f"{name} source: option 'bindings' must be a list of tables "
            f"{{exchange, routing_key, arguments}}, got {raw_bindings!r}")
    for i, b in enumerate(raw_bindings):
        if not isinstance(b, Mapping) or not isinstance(b.get("exchange"), str) \
                or not b["exchange"]:
            raise ValueError(f"{name} source: option 'bindings[{i}]' must be a table with a "
                             f"non-empty 'exchange', got {b!r}")
        unknown = set(b) - {"exchange", "routing_key", "arguments"}
        if unknown:
            raise ValueError(f"{name} source: option 'bindings[{i}]' has unknown key "
                             f"{min(unknown)!r} (known: exchange, routing_key, "
                             f"arguments)")
        rk, args = b.get("routing_key", ""), b.get("arguments", {})
        if not isinstance(rk, str) or not isinstance(args, Mapping):
            raise ValueError(
                f"{name} source: option 'bindings[{i}]': routing_key must be a string and "
                f"arguments a table")
        bindings.append((b["exchange"], rk, dict(args)))

    prefetch_opt = options.get("prefetch_count", "auto")
    auto_value = option_int(name, options, "auto_prefetch", None, minimum=1)
    if prefetch_opt == "auto":
        prefetch, auto = min(auto_value or DEFAULT_PREFETCH, AMQP_MAX_PREFETCH), True
    elif isinstance(prefetch_opt, int) and not isinstance(prefetch_opt, bool):
        if not 1 <= prefetch_opt <= AMQP_MAX_PREFETCH:
            raise ValueError(f"{name} source: option 'prefetch_count' must be between 1 and "
                             f"65535 (0 would mean unlimited: every message in the queue "
                             f"buffered in one producer), got {prefetch_opt}")
        prefetch, auto = prefetch_opt, False
    else:
        raise ValueError(f"{name} source: option 'prefetch_count' must be \"auto\" or an "
                         f"integer, got {prefetch_opt!r}")

    on_success = options.get("on_success", "ack")
    if on_success not in ON_SUCCESS:
        raise ValueError(f"{name} source: option 'on_success' must be one of "
                         f"{', '.join(ON_SUCCESS)}, got {on_success!r}")
    on_failure = options.get("on_failure", "reject_and_requeue")
    if on_failure not in ON_FAILURE:
        raise ValueError(f"{name} source: option 'on_failure' must be one of "
                         f"{', '.join(ON_FAILURE)}, got {on_failure!r}")
    heartbeat = option_int(name, options, "heartbeat", 30, minimum=0)
    backoff_min = option_float(name, options, "backoff_min", 0.1, minimum=0.001)
    backoff_max = option_float(name, options, "backoff_max", 10.0, minimum=backoff_min)
    return RabbitMQSettings(
        url=url, queue=queue, declare=declare, durable=durable, auto_delete=auto_delete,
        queue_arguments=arguments, bindings=tuple(bindings), prefetch_count=prefetch,
        prefetch_auto=auto, on_success=on_success, on_failure=on_failure,
        heartbeat=30 if heartbeat is None else heartbeat,
        connect_timeout=option_float(name, options, "connect_timeout", 5.0, minimum=0.1),
        backoff_min=backoff_min, backoff_max=backoff_max,
        max_message_bytes=option_max_message_bytes(name, options),
        decode=option_decode(name, options),
        dead_letter_queue=option_str(name, options, "dead_letter_queue", None))
