"""The ``redis`` source (one Redis stream through a consumer group, redis-py):

* :mod:`.settings`: the options, validated (pure; what ``check`` uses);
* :mod:`.source`: the :class:`~..base.Source` the producer drives: reads, claims, acks,
  dead letters, reconnection.

See ``docs/sources.md`` for the options and guarantees.
"""

from .settings import DEFAULT_URL, ON_FAILURE, RedisSettings, parse_options
from .source import RedisHandle, RedisStreamsSource

__all__ = ["DEFAULT_URL", "ON_FAILURE", "RedisHandle", "RedisSettings", "RedisStreamsSource",
           "parse_options"]
