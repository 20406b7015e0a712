"""The ``rabbitmq`` source (a consumer on one RabbitMQ queue, through pika), one job per
module:

* :mod:`.settings`: the options, validated (pure; what ``check`` uses), and the failure
  policies;
* :mod:`.delivery`: a delivery as the producer's item (id, body, metadata, handle);
* :mod:`.settle`: settling on one channel: each tag once, acks as ``multiple`` acks;
* :mod:`.probe`: when the queue may be called exhausted (two passive declares at 0);
* :mod:`.connection`: the I/O thread: connect, consume, reconnect with backoff, run the
  producer's commands;
* :mod:`.source`: the :class:`~..base.Source` the producer drives.

The hand-over from the I/O thread to the producer, with its wake-up fd, is the
:class:`~..mailbox.Mailbox` the ``nats`` source uses too.  See ``docs/sources.md`` for the
options and guarantees.
"""

from ...runtime.redact import mask_url
from .delivery import RabbitMQHandle, packable
from .settings import (
    AMQP_MAX_PREFETCH,
    DEFAULT_PREFETCH,
    DEFAULT_URL,
    ON_FAILURE,
    RabbitMQSettings,
    parse_options,
)
from .source import RabbitMQSource

__all__ = ["AMQP_MAX_PREFETCH", "DEFAULT_PREFETCH", "DEFAULT_URL", "ON_FAILURE",
           "RabbitMQHandle", "RabbitMQSettings", "RabbitMQSource", "mask_url", "packable",
           "parse_options"]
