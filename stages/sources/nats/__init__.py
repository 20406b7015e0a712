"""The ``nats`` source (JetStream durable pull consumer), one job per module:

* :mod:`.settings`: the options, validated (pure; what ``check`` uses);
* :mod:`.mailbox`: the hand-over from the I/O thread to the producer, with its wake-up fd;
* :mod:`.connection`: the asyncio I/O thread: connect, pull within the window, settle,
  keep owned messages owned, probe for idleness;
* :mod:`.source`: the :class:`~..base.Source` the producer drives.

See ``docs/sources.md`` for the options and guarantees.
"""

from .source import NatsSource

__all__ = ["NatsSource"]
