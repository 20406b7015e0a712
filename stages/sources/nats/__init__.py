"""The ``nats`` source (JetStream durable pull consumer), one job per module:

* :mod:`.settings`: the options, validated (pure; what ``check`` uses);
* :mod:`.connection`: the asyncio I/O thread: connect, pull within the window, settle,
  keep owned messages owned, probe for idleness;
* :mod:`.delivery`: a JetStream message as the producer's item, and its dead letter's headers;
* :mod:`.source`: the :class:`~..base.Source` the producer drives.

The hand-over from the I/O thread to the producer, with its wake-up fd, is the
:class:`~..mailbox.Mailbox` the ``rabbitmq`` source uses too.

See ``docs/sources.md`` for the options and guarantees.
"""

from .source import NatsSource

__all__ = ["NatsSource"]
