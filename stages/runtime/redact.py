"""Secrets out of what operators see: URLs in logs, ``status``, metrics and error messages.

One helper for every place a URL can be shown (the broker sources, the Spark sink, the
daemon's config errors), so masking cannot drift between them.  It lives in ``stages``
because sources and the Spark sink run in stage processes and must not import the daemon;
the daemon may import it.

What counts as a secret in a URL: the password of ``user:password@host`` (AMQP, Redis),
and the value of a parameter whose name says it is one, in the query (``?password=``,
which redis-py honours) or in Spark Connect's ``;key=value`` parameters
(``sc://host:15002/;token=...``).  User names, hosts, ports and paths stay readable: they
are what an operator needs to tell which broker is meant.

Config values (a source's options, a reload's diff) are shown through :func:`mask_value`:
an option whose name says it is a secret (``password``, ``api_token``...) is masked whole,
and every URL in them loses its secrets.  :func:`value_secrets` lists those secrets so that
:class:`RedactFilter` can take them out of any log line that quotes one anyway (a client
library's message, a user's handler): the last line of defence on every process's log.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, unquote, urlsplit

MASK = "***"
#: parameter names (lower case) whose values are secrets
SECRET_PARAMS = frozenset({"password", "passwd", "pwd", "token", "access_token", "secret",
                           "api_key", "apikey", "auth", "authorization", "sasl_password"})
_PARAM = re.compile(r"(?P<sep>[;&?]|^)(?P<key>[^;&=?/]+)=(?P<value>[^;&]*)")


#: endings of option names that hold secrets (``db_password``, ``api_token``)
_SECRET_ENDINGS = ("password", "passwd", "secret", "token", "api_key", "apikey",
                   "credentials", "private_key")


def secret_name(name: str) -> bool:
    """Whether an option or parameter named ``name`` holds a secret."""
    n = name.strip().lower()
    return n in SECRET_PARAMS or n.endswith(_SECRET_ENDINGS)


def mask_value(value: Any, name: str = "") -> Any:
    """A config value (an option, a section, a list) as it may be shown: options named
    like secrets masked whole, URLs without their secrets, everything else as it is."""
    if name and secret_name(name) and value not in (None, "", False):
        return MASK
    if isinstance(value, str):
        return mask_url(value) if "://" in value else value
    if isinstance(value, Mapping):
        return {k: mask_value(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(mask_value(v) for v in value)
    return value


def value_secrets(value: Any, name: str = "") -> list[str]:
    """Every secret string inside a config value (see :func:`mask_value`), longest
    first, raw and as they appear percent-encoded or decoded in a URL."""
    found: set[str] = set()
    if name and secret_name(name) and isinstance(value, (str, int, float)) \
            and not isinstance(value, bool):
        text = str(value)
        found.update({text, quote(text, safe=""), unquote(text)})
    elif isinstance(value, str) and "://" in value:
        for secret in url_secrets(value):
            found.update({secret, quote(secret, safe="")})
    elif isinstance(value, Mapping):
        for k, v in value.items():
            found.update(value_secrets(v, str(k)))
    elif isinstance(value, (list, tuple)):
        for v in value:
            found.update(value_secrets(v))
    return sorted((s for s in found if len(s) >= 3), key=len, reverse=True)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every one of ``secrets`` replaced by ``***``."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


class RedactFilter(logging.Filter):
    """Takes known secrets out of every record that passes a handler: the message as
    formatted, and a traceback's text.  Installed on the handlers of the daemon and of
    every stage, with the secrets of the pipeline's config (:func:`value_secrets`)."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.secrets = sorted(set(secrets), key=len, reverse=True)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        message = record.getMessage()
        clean = scrub(message, self.secrets)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text, self.secrets)
        return True


def install_filter(secrets: Iterable[str]) -> None:
    """Put a :class:`RedactFilter` with ``secrets`` on every handler of the root logger
    (replacing one installed before: a reload can change the secrets)."""
    secrets = list(secrets)
    for handler in logging.getLogger().handlers:
        for f in list(handler.filters):
            if isinstance(f, RedactFilter):
                handler.removeFilter(f)
        if secrets:
            handler.addFilter(RedactFilter(secrets))


def _mask_params(text: str) -> str:
    def sub(m: re.Match[str]) -> str:
        if m.group("key").strip().lower() in SECRET_PARAMS and m.group("value"):
            return f"{m.group('sep')}{m.group('key')}={MASK}"
        return m.group(0)

    return _PARAM.sub(sub, text)


def mask_url(url: str) -> str:
    """``url`` with its password and secret parameters replaced by ``***``.

    A URL that cannot be parsed is not shown at all (``<unparsable url>``): where the
    password ends in a malformed URL is anybody's guess, and a guess may show it.
    """
    try:
        parts = urlsplit(url)
        parts.port   # noqa: B018 - raises ValueError for a port out of range
    except (ValueError, TypeError):
        return "<unparsable url>"
    # rebuilt by hand rather than with urlunsplit, which drops an empty authority
    # (``unix:///tmp/redis.sock`` would come back as ``unix:/tmp/redis.sock``)
    scheme, sep, rest = url.partition("://")
    if not sep:
        return _mask_params(url)
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    netloc, tail = rest[:end], rest[end:]
    if parts.password is not None:
        netloc = f"{parts.username or ''}:{MASK}@{netloc.rsplit('@', 1)[1]}"
    return f"{scheme}://{netloc}{_mask_params(tail)}"


def url_secrets(url: str) -> list[str]:
    """The secret strings inside ``url`` (raw and percent-decoded), for :func:`redact`."""
    try:
        parts = urlsplit(url)
    except (ValueError, TypeError):
        return []
    found: list[str] = []
    if parts.password:
        found.append(parts.password)
    for text in (parts.path, parts.query):
        for m in _PARAM.finditer(text):
            if m.group("key").strip().lower() in SECRET_PARAMS and m.group("value"):
                found.append(m.group("value"))
    return sorted({s for f in found for s in (f, unquote(f)) if len(s) >= 3},
                  key=len, reverse=True)


def redact(text: str, *urls: str) -> str:
    """``text`` (an error message, a log line) with every secret of ``urls`` masked.

    For messages of client libraries we do not control: if one ever quotes the URL or the
    password, it does not reach a log or ``status`` with it.  Secrets shorter than 3
    characters are left alone (masking every ``a`` would make the text unreadable and
    hide nothing worth hiding).
    """
    for url in urls:
        if url in text:
            text = text.replace(url, mask_url(url))
        for secret in url_secrets(url):
            text = text.replace(secret, MASK)
    return text


def root_cause(exc: BaseException) -> BaseException:
    """The innermost exception ``exc`` wraps: client libraries wrap the socket's error in
    their own, sometimes with no message at all (pika's ``AMQPConnectionError()`` around a
    ``ConnectionRefusedError``), and the operator needs the socket's words."""
    seen = {id(exc)}
    while True:
        inner = [a for a in getattr(exc, "args", ()) if isinstance(a, BaseException)]
        many = getattr(exc, "exceptions", None)
        if isinstance(many, (list, tuple)) and many:
            inner.append(many[-1])
        one = getattr(exc, "exception", None)
        if isinstance(one, BaseException):
            inner.append(one)
        if exc.__cause__ is not None:
            inner.append(exc.__cause__)
        nxt = next((e for e in inner if isinstance(e, BaseException) and id(e) not in seen),
                   None)
        if nxt is None:
            return exc
        seen.add(id(nxt))
        exc = nxt


def describe_error(exc: BaseException, *urls: str, limit: int = 300) -> str:
    """``"Type: message"`` on one bounded line, with the secrets of ``urls`` masked: what a
    source keeps as ``last_error`` and logs.  A wrapper names its innermost cause first
    (``ConnectionRefusedError: [Errno 111] Connection refused (in AMQPConnectionError)``)."""
    cause = root_cause(exc)
    text = f"{type(cause).__name__}: {cause}".rstrip(": ")
    if cause is not exc:
        text += f" (in {type(exc).__name__})"
    text = redact(" ".join(text.split()), *urls)
    return text if len(text) <= limit else text[:limit - 3] + "..."
