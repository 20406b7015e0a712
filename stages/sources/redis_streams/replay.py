"""Redis's dead letters for ``offbroadway dead-letters``: the dead-letter stream
(``dead_letter_stream``, default ``<stream>:dead``) the source copies failed entries to.

Each dead entry carries the original fields plus ``dead_letter.id``, ``.stream``,
``.group``, ``.consumer``, ``.reason`` and ``.at``.  A replay moves an entry back: its
original fields (without the ``dead_letter.*`` ones) are added to the stream it came from
as a new entry, and the dead entry is deleted, both in one Lua script, so the move is
atomic and a dead entry already moved (another replay got there first) is not added
twice.  What was moved is out of the dead-letter stream: a second replay finds nothing,
and an entry that fails again after its replay is a new dead letter.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import redis

from ...runtime.redact import mask_url
from ..deadletters import DeadLetter, DeadLetterBox, DeadLetterError, Replayed
from .settings import parse_options

PREFIX = b"dead_letter."
PAGE = 1000
#: delete the dead entry and add its fields to the stream, or do nothing if it is gone
MOVE = """
if redis.call('XDEL', KEYS[1], ARGV[1]) == 1 then
  redis.call('XADD', KEYS[2], '*', unpack(ARGV, 2))
  return 1
end
return 0
"""


def _text(value: bytes) -> str:
    return value.decode("utf-8", "replace")


class RedisDeadLetters(DeadLetterBox):
    def __init__(self, options: Mapping[str, Any]) -> None:
        s = parse_options(options)
        self.stream = s.stream
        self.dead = s.dead_letter_stream or f"{s.stream}:dead"
        self.where = f"stream {self.dead!r} at {mask_url(s.url)}"
        self._client = redis.Redis.from_url(s.url, socket_timeout=s.socket_timeout,
                                            socket_connect_timeout=s.socket_timeout)

    def _fail(self, exc: Exception) -> DeadLetterError:
        return DeadLetterError(f"{self.where}: {type(exc).__name__} {exc}")

    def letters(self) -> list[DeadLetter]:
        out: list[DeadLetter] = []
        start = "-"
        try:
            while True:
                page = self._client.xrange(self.dead, min=start, max="+", count=PAGE)
                for entry_id, fields in page:
                    out.append(self._letter(entry_id, fields))
                if len(page) < PAGE:
                    return out
                start = "(" + _text(page[-1][0])
        except redis.RedisError as exc:
            raise self._fail(exc) from None

    def _letter(self, entry_id: bytes, fields: dict[bytes, bytes]) -> DeadLetter:
        meta = {_text(k[len(PREFIX):]): _text(v) for k, v in fields.items()
                if k.startswith(PREFIX)}
        original = {k: v for k, v in fields.items() if not k.startswith(PREFIX)}
        try:
            at: float | None = float(meta.get("at", ""))
        except ValueError:
            at = None
        stream = meta.get("stream") or self.stream
        return DeadLetter(
            key=_text(entry_id), reason=meta.get("reason", ""), failed_at=at,
            origin=f"stream {stream} entry {meta.get('id', '?')}",
            body=json.dumps({_text(k): _text(v) for k, v in original.items()},
                            ensure_ascii=False),
            handle=(entry_id, stream, original))

    def replay(self, letters: list[DeadLetter], replayed: Replayed) -> str:
        move = self._client.register_script(MOVE)
        moved: dict[str, list[str]] = {}
        gone = 0
        try:
            for d in letters:
                entry_id, stream, original = d.handle
                args: list[Any] = [entry_id]
                for k, v in original.items():
                    args += [k, v]
                if move(keys=[self.dead, stream], args=args):
                    replayed.record([d.key], f"stream {stream}")
                    moved.setdefault(stream, []).append(d.key)
                else:
                    gone += 1
        except redis.RedisError as exc:
            done = sum(len(v) for v in moved.values())
            raise DeadLetterError(f"{self.where}: {type(exc).__name__} {exc}; {done} were "
                                  f"replayed before (the rest stay dead letters)") from None
        to = ", ".join(f"{len(keys)} to stream {s!r}" for s, keys in sorted(moved.items()))
        return (f"replayed {to or 'none'} (moved out of {self.where})"
                + (f"; {gone} were gone meanwhile" if gone else ""))

    def close(self) -> None:
        self._client.close()
