"""The ``redis`` source (one Redis stream through a consumer group, redis-py):

* :mod:`.settings`: the options, validated (pure; what ``check`` uses);
* :mod:`.entries`: a stream entry read for the producer (ids, UTF-8 fields, its size);
* :mod:`.source`: the :class:`~..base.Source` the producer drives: reads, claims, acks,
  dead letters, reconnection.

See ``docs/sources.md`` for the options and guarantees.
"""

from .entries import RedisHandle
from .settings import DEFAULT_URL, ON_FAILURE, RedisSettings, parse_options
from .source import RedisStreamsSource

__all__ = ["DEFAULT_URL", "ON_FAILURE", "RedisHandle", "RedisSettings", "RedisStreamsSource",
           "parse_options"]
