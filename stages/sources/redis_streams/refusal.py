"""Would Redis refuse this source as configured?  One connection, before ``run`` starts
anything (a Spark server's JVM takes half a minute; see the rabbitmq source's twin).

It asks what :meth:`~.source.RedisStreamsSource.open` asks, without writing anything: the
password (``PING``), and, when the group would be created, whether the key holds a stream
(``XINFO STREAM``; ``open`` would get the same ``WRONGTYPE`` from ``XGROUP CREATE``).  A
server that does not answer within a few seconds is not a refusal: the source retries it.
"""

from __future__ import annotations

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ...runtime.redact import describe_error, mask_url
from .settings import RedisSettings

#: at most this long for the check's connection (the source's socket_timeout if shorter)
CHECK_TIMEOUT = 3.0


def refusal(st: RedisSettings, pipeline: str = "") -> str | None:
    """The line :meth:`~.source.RedisStreamsSource.open` would fail with, or None."""
    timeout = min(st.socket_timeout, CHECK_TIMEOUT)
    client = redis.Redis.from_url(st.url, socket_timeout=timeout,
                                  socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0),
                                  retry_on_timeout=False)
    try:
        client.ping()
        if st.create_group and client.exists(st.stream):
            client.xinfo_stream(st.stream)
    except (redis.ResponseError, redis.AuthenticationError) as exc:
        group = st.group or pipeline or "offbroadway"
        return (f"redis source: cannot read stream {st.stream!r} as group {group!r} at "
                f"{mask_url(st.url)}: {describe_error(exc, st.url)}")
    except redis.RedisError:
        return None
    finally:
        client.close()
    return None
