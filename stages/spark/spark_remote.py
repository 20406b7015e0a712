"""Where a Spark client connects, and with which token: the one definition.

The committers are the pipeline's only Spark clients.  With a local server the daemon
starts (:mod:`offbroadway.daemon.spark.server`), it hands each committer incarnation the
*current* server's address and token in its environment (:func:`handover`, evaluated at
every committer start, so a restarted server with a fresh port and token is followed);
with ``[spark] remote`` the settings carry the address and say where the token is.

No pyspark here: the daemon imports this module (it must stay light) and so does the
committer's sink (:mod:`.spark_sink`).
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from ..runtime.redact import mask_url

#: the Connect URL of the daemon's own server (``sc://localhost:PORT``)
ENV_REMOTE = "OFFBROADWAY_SPARK_REMOTE"
#: its token; the daemon also hands the server wrapper its token under this name
ENV_TOKEN = "OFFBROADWAY_SPARK_TOKEN"


def handover(port: int, token: str) -> dict[str, str]:
    """The environment a committer gets for the daemon's own server at ``port``."""
    return {ENV_REMOTE: f"sc://localhost:{port}", ENV_TOKEN: token}


def normalize_remote(remote: str) -> str:
    """``sc://127.0.0.1:P`` → ``sc://localhost:P``.

    pyspark speaks plaintext over loopback only for the literal host ``localhost`` and
    otherwise insists on TLS as soon as a token is set (``127.0.0.1`` with a token hangs
    in a TLS handshake).  Raises ``ValueError`` (the URL masked) for anything else than
    ``sc://host[:port]``.
    """
    parts = urlsplit(remote)
    if parts.scheme != "sc" or not parts.hostname:
        raise ValueError(f"Spark Connect remote must look like sc://host:port, "
                         f"got {mask_url(remote)!r}")
    if parts.hostname in ("127.0.0.1", "::1"):
        netloc = "localhost" + (f":{parts.port}" if parts.port else "")
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return remote


def token(token_file: str | None = None, token_env: str | None = None) -> str | None:
    """The token, from the first that applies (it is never logged, never in a URL):

    1. ``token_file``: a file holding it (read at every call, so a session opened after a
       rotation uses the new credential);
    2. ``token_env``: the name of an environment variable holding it;
    3. :data:`ENV_TOKEN`, what the daemon hands over for its own server;
    4. none (a server without authentication).
    """
    if token_file:
        return Path(token_file).read_text().strip() or None
    if token_env:
        return os.environ.get(token_env) or None
    return os.environ.get(ENV_TOKEN) or None
