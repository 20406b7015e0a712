"""Would the broker refuse this source as configured?  One connection, before ``run``
starts anything.

Why: a wrong password or a missing queue is otherwise found by the producer's
:meth:`~.source.RabbitMQSource.open`, which runs after the pipeline's Spark server is
ready (half a minute of JVM); under ``Restart=on-failure`` each typo then costs three JVM
starts.  This opens one connection the way the consumer does (the same URL parameters, the
same passive ``queue.declare`` when the source does not declare the queue itself) and
closes it, and says the refusal in the words :meth:`~.source.RabbitMQSource.open` would
use.  A broker that does not answer within a few seconds is not a refusal: the source
retries that, so the daemon starts as it would have.
"""

from __future__ import annotations

import logging

import pika
import pika.exceptions as amqp_errors

from ...runtime.redact import describe_error, mask_url
from .connection import is_permanent
from .settings import RabbitMQSettings

#: at most this long for the check's connection (the source's connect_timeout if shorter)
CHECK_TIMEOUT = 3.0

if logging.getLogger("pika").level == logging.NOTSET:   # as the consumer: no pika noise
    logging.getLogger("pika").setLevel(logging.CRITICAL)


def refusal(s: RabbitMQSettings) -> str | None:
    """The line :meth:`~.source.RabbitMQSource.open` would fail with, or None."""
    timeout = min(s.connect_timeout, CHECK_TIMEOUT)
    params = pika.URLParameters(s.url)
    params.socket_timeout = timeout
    params.stack_timeout = timeout * 2
    params.blocked_connection_timeout = timeout * 2
    params.connection_attempts = 1
    params.client_properties = {"connection_name": "offbroadway check"}
    try:
        conn = pika.BlockingConnection(params)
    except Exception as exc:     # pika raises several types; only a refusal counts
        return _said(s, exc) if is_permanent(exc) else None
    try:
        if not s.declare:
            conn.channel().queue_declare(s.queue, passive=True)
    except Exception as exc:
        return _said(s, exc) if is_permanent(exc) else None
    finally:
        try:
            conn.close()
        except (amqp_errors.AMQPError, OSError):
            pass
    return None


def _said(s: RabbitMQSettings, exc: BaseException) -> str:
    return (f"rabbitmq source: cannot consume queue {s.queue!r} at {mask_url(s.url)}: "
            f"{describe_error(exc, s.url)}")
