"""A user's own RabbitMQ source that takes its password as an option named ``password``
(as many site-specific sources do): the daemon must treat that option as a secret on every
surface, as it treats the password in a URL."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from offbroadway.stages.sources.rabbitmq import RabbitMQSource


class PasswordRabbitMQ(RabbitMQSource):
    """``url`` with its user, and ``password`` apart: put together before connecting."""

    known_options = RabbitMQSource.known_options | {"password"}

    def __init__(self, options: Mapping[str, Any], **kwargs: Any) -> None:
        opts = dict(options)
        password = opts.pop("password", None)
        if password:
            parts = urlsplit(opts["url"])
            host = parts.netloc.rsplit("@", 1)[-1]
            netloc = f"{parts.username}:{quote(password, safe='')}@{host}"
            opts["url"] = urlunsplit(parts._replace(netloc=netloc))
        super().__init__(opts, **kwargs)
