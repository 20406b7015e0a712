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
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

MASK = "***"
#: parameter names (lower case) whose values are secrets
SECRET_PARAMS = frozenset({"password", "passwd", "pwd", "token", "access_token", "secret",
                           "api_key", "apikey", "auth", "authorization", "sasl_password"})
_PARAM = re.compile(r"(?P<sep>[;&?]|^)(?P<key>[^;&=?/]+)=(?P<value>[^;&]*)")


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
