"""NATS JetStream's dead letters for ``offbroadway dead-letters``: the messages the source
published to ``dead_letter_subject``, in whichever stream captures that subject.

Each dead letter is the original body and headers plus ``Offbroadway-Dead-Letter-Reason``,
``-Stream``, ``-Consumer``, ``-Subject``, ``-Sequence`` and ``-Delivered``.  A replay
publishes the body and the original headers back to the original subject through
JetStream (so the source's stream stores it again), then deletes the dead letter from its
stream.  The replay is published with ``Nats-Msg-Id: replay-<dead stream>-<sequence>``
(the original id would be dropped as a duplicate within the stream's duplicate window;
``Offbroadway-Replay-Of`` keeps it): a replay interrupted between the publish and the
delete publishes again under the same id, which the stream drops as a duplicate within
its window.  What was replayed is out of the dead-letter stream: a second replay finds
nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import nats
import nats.errors
import nats.js.errors

from ...runtime.redact import mask_url
from ..deadletters import DeadLetter, DeadLetterBox, DeadLetterError, Replayed
from .delivery import DEAD_LETTER_HEADER
from .settings import parse_options

MAX_LISTED = 100_000


class NatsDeadLetters(DeadLetterBox):
    def __init__(self, options: Mapping[str, Any], pipeline: str) -> None:
        s = parse_options(options, pipeline=pipeline)
        if not s.dead_letter_subject:
            raise DeadLetterError(
                "nats source: option 'dead_letter_subject' is not set: failed messages are "
                "terminated in the stream, not kept as dead letters")
        self.settings = s
        self.subject = s.dead_letter_subject
        self.where = f"subject {self.subject!r} at {mask_url(s.url)}"
        self.loop = asyncio.new_event_loop()
        self.nc: Any = None
        self.stream = ""

    def _run(self, coro: Any) -> Any:
        try:
            return self.loop.run_until_complete(asyncio.wait_for(
                coro, 30 + self.settings.connect_timeout))
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            raise DeadLetterError(f"{self.where}: {type(exc).__name__} {exc}") from None

    async def _connect(self) -> Any:
        if self.nc is None:
            self.nc = await nats.connect(self.settings.url,
                                         connect_timeout=self.settings.connect_timeout,
                                         allow_reconnect=False, max_reconnect_attempts=1)
            js = self.nc.jetstream()
            try:
                self.stream = await js.find_stream_name_by_subject(self.subject)
            except nats.js.errors.NotFoundError:
                raise DeadLetterError(f"{self.where}: no stream captures that subject (the "
                                      f"source could not have stored any)") from None
            self.where = f"subject {self.subject!r} (stream {self.stream}) at " \
                         f"{mask_url(self.settings.url)}"
        return self.nc.jetstream()

    async def _letters(self) -> list[DeadLetter]:
        js = await self._connect()
        info = await js.stream_info(self.stream)
        out: list[DeadLetter] = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            if len(out) >= MAX_LISTED or not info.state.messages:
                break
            try:
                msg = await js.get_msg(self.stream, seq)
            except nats.js.errors.NotFoundError:
                continue                        # deleted (replayed) or expired
            if msg.subject != self.subject:
                continue
            headers = dict(msg.headers or {})
            dead = {k[len(DEAD_LETTER_HEADER) + 1:]: v for k, v in headers.items()
                    if k.startswith(DEAD_LETTER_HEADER + "-")}
            original = {k: v for k, v in headers.items()
                        if not k.startswith(DEAD_LETTER_HEADER + "-")}
            subject = dead.get("Subject")
            if not subject:
                continue                        # not a dead letter of the source's
            at = msg.time.timestamp() if getattr(msg, "time", None) else None
            out.append(DeadLetter(
                key=f"{self.stream}:{seq}", reason=dead.get("Reason", ""), failed_at=at,
                origin=f"stream {dead.get('Stream', '?')} sequence {dead.get('Sequence', '?')}"
                       f" (subject {subject})",
                body=(msg.data or b"").decode("utf-8", "replace"),
                handle=(seq, subject, msg.data or b"", original)))
        return out

    def letters(self) -> list[DeadLetter]:
        return self._run(self._letters())

    async def _replay(self, letters: list[DeadLetter], replayed: Replayed) -> dict[str, int]:
        js = await self._connect()
        moved: dict[str, int] = {}
        for d in letters:
            seq, subject, data, original = d.handle
            headers = {k: v for k, v in original.items() if k != "Nats-Msg-Id"}
            if "Nats-Msg-Id" in original:
                headers["Offbroadway-Replay-Of"] = original["Nats-Msg-Id"]
            headers["Nats-Msg-Id"] = f"replay-{self.stream}-{seq}"
            await js.publish(subject, data, headers=headers)
            replayed.record([d.key], f"subject {subject}")
            await js.delete_msg(self.stream, seq)
            moved[subject] = moved.get(subject, 0) + 1
        return moved

    def replay(self, letters: list[DeadLetter], replayed: Replayed) -> str:
        moved = self._run(self._replay(letters, replayed))
        to = ", ".join(f"{n} to subject {s!r}" for s, n in sorted(moved.items()))
        return f"replayed {to or 'none'} (deleted from {self.where})"

    def close(self) -> None:
        if self.nc is not None:
            try:
                self.loop.run_until_complete(self.nc.close())
            except Exception:
                pass
        self.loop.close()
