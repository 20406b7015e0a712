"""Would the NATS server refuse this source as configured?  One connection, before ``run``
starts anything (a Spark server's JVM takes half a minute; see the rabbitmq source's twin).

It asks what the I/O thread's first connection asks (:mod:`.connection`,
``_ensure_consumer``), without creating anything: whether the stream exists and, when the
consumer may not be created, whether it does.  A server that does not answer within a
few seconds is not a refusal: the source retries it.
"""

from __future__ import annotations

import asyncio

import nats
import nats.js.errors

from ...runtime.redact import mask_url
from .connection import _STREAM_NOT_FOUND
from .settings import NatsSettings

#: at most this long for the check (the source's connect_timeout if shorter)
CHECK_TIMEOUT = 3.0


def refusal(s: NatsSettings) -> str | None:
    """The line :meth:`~.source.NatsSource.open` would fail with, or None."""
    try:
        why = asyncio.run(asyncio.wait_for(_ask(s), CHECK_TIMEOUT * 2))
    except Exception:   # unreachable, a timeout, anything else: the source's retries
        return None
    if why is None:
        return None
    return f"nats source: cannot consume {s.stream}/{s.consumer} at {mask_url(s.url)}: {why}"


async def _ask(s: NatsSettings) -> str | None:
    timeout = min(s.connect_timeout, CHECK_TIMEOUT)
    nc = await nats.connect(servers=[s.url], name="offbroadway check",
                            connect_timeout=timeout, allow_reconnect=False,
                            max_reconnect_attempts=0)
    try:
        jsm = nc.jetstream(timeout=timeout)._jsm
        try:
            await jsm.consumer_info(s.stream, s.consumer)
        except nats.js.errors.NotFoundError as exc:
            if exc.err_code == _STREAM_NOT_FOUND:
                return f"stream {s.stream!r} does not exist"
            if not s.create_consumer:
                return (f"consumer {s.consumer!r} does not exist on stream {s.stream!r} "
                        f"(and create_consumer is false)")
        return None
    finally:
        await nc.close()
