"""Source registry: ``[producer] source = NAME`` → the class that implements it.

Sources are registered by module path, not imported here, because a source's module pulls
in its client library (pika, redis): only a producer that uses RabbitMQ should pay for
importing pika, and a machine without the ``brokers`` extra must still run the spool.
``get_source`` imports the one module asked for.

Besides the built-in names, ``source = "package.module:ClassName"`` loads a user's own
:class:`~.base.Source` subclass, the same way ``pipeline.handler`` names the handler.
"""

from __future__ import annotations

import importlib
from typing import Any

from .base import Failure, Item, Source, SourceOptionError

__all__ = ["REQUIRED_METHODS", "Failure", "Item", "Source", "SourceOptionError",
           "UnknownSourceError", "get_source", "known_sources", "missing_methods",
           "sized_options", "window_max", "window_option"]

# name → "module (relative to this package):ClassName"
_REGISTRY: dict[str, str] = {
    "generator": ".generator:GeneratorSource",
    "spool": ".spool:SpoolSource",
    "rabbitmq": ".rabbitmq:RabbitMQSource",
    "redis": ".redis_streams:RedisStreamsSource",
    "nats": ".nats:NatsSource",
}


#: built-in sources with a window of delivered, unsettled messages → the option that sets
#: it (each class's ``window_option`` is read from here, so validation can ask without
#: importing a broker client: :func:`window_option`)
_WINDOWS: dict[str, str] = {"rabbitmq": "prefetch_count", "nats": "prefetch"}


def window_option(name: str) -> str | None:
    """The option that sets a built-in source's window (None: it has none, or the source
    is a user's, which validation does not import)."""
    return _WINDOWS.get(name)


#: built-in sources whose protocol bounds the window: AMQP's basic.qos carries
#: ``prefetch_count`` in 16 bits (``rabbitmq.settings.AMQP_MAX_PREFETCH``, not imported
#: here: that package imports pika); a NATS pull window has no such field
_WINDOW_MAX: dict[str, int] = {"rabbitmq": 65535}


def window_max(name: str) -> int | None:
    """The largest window a built-in source's protocol can say (None: no such bound)."""
    return _WINDOW_MAX.get(name)


class UnknownSourceError(ValueError):
    """The configured source name is neither registered nor a ``module:Class`` path."""


def known_sources() -> list[str]:
    """The registered source names, sorted (for error messages and ``check``)."""
    return sorted(_REGISTRY)


def get_source(name: str) -> type[Source]:
    """Import and return the source class registered as ``name`` (or at ``module:Class``).

    Raises :class:`UnknownSourceError` listing the known names for a name that is neither,
    and ``ImportError`` saying which extra to install when a registered source's module (or
    its client library) cannot be imported.
    """
    if not isinstance(name, str) or not name:
        raise UnknownSourceError(f"source must be a non-empty name; known sources: "
                                 f"{', '.join(known_sources())}")
    target = _REGISTRY.get(name)
    if target is None:
        if ":" not in name:
            raise UnknownSourceError(
                f"unknown source {name!r}; known sources: {', '.join(known_sources())} "
                f"(or 'package.module:ClassName' for your own)")
        target = name
    module_name, _, class_name = target.partition(":")
    try:
        if module_name.startswith("."):
            module = importlib.import_module(module_name, __name__)
        else:
            module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = " (install offbroadway[brokers])" if name in ("rabbitmq", "redis", "nats") \
            else ""
        raise ImportError(f"source {name!r} cannot be loaded: {exc}{hint}") from exc
    except Exception as exc:    # a user's module that fails while it is imported
        raise ImportError(f"source {name!r} cannot be loaded: importing {module_name} "
                          f"raised {type(exc).__name__}: {exc}") from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        raise UnknownSourceError(f"source {name!r}: module {module_name} has no "
                                 f"{class_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Source)):
        raise UnknownSourceError(f"source {name!r}: {module_name}:{class_name} is not a "
                                 f"subclass of offbroadway.stages.sources.base.Source")
    missing = missing_methods(cls)
    if missing:
        raise UnknownSourceError(
            f"source {name!r}: {module_name}:{class_name} does not implement "
            f"{', '.join(missing)} (a source implements {', '.join(REQUIRED_METHODS)}; see "
            f"docs/sources.md, 'Your own source')")
    return cls


def sized_options(name: str, options: dict[str, Any], capacity: int) -> dict[str, Any]:
    """``options`` as the source ``name`` sizes them for a topology that holds ``capacity``
    messages per producer (:meth:`.base.Source.sized_options`).  A source that cannot be
    loaded gets its options as they are: :func:`get_source`'s error is the producer's (and
    ``check``'s) to report, in its own words."""
    try:
        cls = get_source(name)
    except (ImportError, UnknownSourceError):
        return dict(options)
    return cls.sized_options(options, capacity)


#: what a source must implement itself (the rest of :class:`Source` has working defaults)
REQUIRED_METHODS = ("fetch", "ack", "fail", "requeue", "exhausted")


def missing_methods(cls: type[Source]) -> list[str]:
    """The required methods ``cls`` leaves abstract or replaces with a non-callable."""
    return [m for m in REQUIRED_METHODS
            if m in getattr(cls, "__abstractmethods__", ()) or not callable(getattr(cls, m,
                                                                                   None))]
