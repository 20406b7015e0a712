"""RabbitMQ's dead letters for ``offbroadway dead-letters``: the queue bound to the source
queue's dead-letter exchange (option ``dead_letter_queue``), read and replayed over AMQP.

Listing takes every message with ``basic.get`` and gives them all back (``basic.nack``
with requeue): the queue is left as it was.  A replay moves each chosen message back to
the queue it was dead-lettered from (the newest ``x-death`` entry says which; the source's
queue if none does), through the default exchange, with its body and properties and
without the ``x-death`` headers (a new life: an ``x-offbroadway-replays`` header counts
them), and acks it in the dead-letter queue in the same AMQP transaction (``tx.select``:
the publish and the ack take effect together at ``tx.commit``, so a replay interrupted by
a crash or a lost connection moves a message entirely or not at all).  What was moved is
out of the dead-letter queue, so a second replay finds nothing to do; a message that
fails again after its replay is dead-lettered again and may be replayed again.

AMQP carries no reason for a rejection: the reason listed is the broker's (``rejected``,
``expired``, ``maxlen``); the processor logged the handler's.
"""

from __future__ import annotations

import calendar
import datetime
import hashlib
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pika
import pika.exceptions as amqp_errors

from ...runtime.redact import mask_url
from ..deadletters import DeadLetter, DeadLetterBox, DeadLetterError, Replayed
from .settings import parse_options

#: the most a listing holds (and gives back) at once
MAX_LISTED = 100_000
#: messages per AMQP transaction of a replay
PER_COMMIT = 200
DEATH_HEADERS = ("x-death", "x-first-death-queue", "x-first-death-reason",
                 "x-first-death-exchange", "x-last-death-queue", "x-last-death-reason",
                 "x-last-death-exchange")
REPLAYS = "x-offbroadway-replays"


def _epoch(value: Any) -> float | None:
    if isinstance(value, datetime.datetime):
        return float(calendar.timegm(value.utctimetuple()))
    if isinstance(value, (int, float)):
        return float(value)
    return None


class RabbitMQDeadLetters(DeadLetterBox):
    def __init__(self, options: Mapping[str, Any]) -> None:
        s = parse_options(options)
        if not s.dead_letter_queue:
            raise DeadLetterError(
                "rabbitmq source: option 'dead_letter_queue' is not set: name the queue "
                "bound to the dead-letter exchange of queue "
                f"{s.queue!r} (x-dead-letter-exchange) to list and replay its dead letters")
        self.settings = s
        self.queue = s.dead_letter_queue
        self.where = f"queue {self.queue!r} at {mask_url(s.url)}"
        self._conn: pika.BlockingConnection | None = None

    def _channel(self) -> Any:
        params = pika.URLParameters(self.settings.url)
        params.socket_timeout = params.blocked_connection_timeout = \
            self.settings.connect_timeout
        try:
            self._conn = pika.BlockingConnection(params)
            channel = self._conn.channel()
            channel.queue_declare(self.queue, passive=True)
            return channel
        except amqp_errors.ChannelClosedByBroker as exc:
            raise DeadLetterError(f"{self.where}: {exc.reply_text}") from None
        except (amqp_errors.AMQPError, OSError) as exc:
            raise DeadLetterError(f"{self.where}: cannot connect: "
                                  f"{type(exc).__name__} {exc}") from None

    def _letter(self, props: Any, body: bytes) -> DeadLetter:
        headers = dict(props.headers or {})
        deaths = headers.get("x-death") or [{}]
        death = deaths[0] if isinstance(deaths[0], dict) else {}
        origin = str(death.get("queue") or self.settings.queue)
        count = death.get("count", 1)
        ident = props.message_id or hashlib.sha256(body).hexdigest()[:16]
        reason = death.get("reason", "")
        reason = reason.decode() if isinstance(reason, bytes) else str(reason)
        return DeadLetter(key=f"{ident}@{origin}#{count}", reason=reason or "(no x-death)",
                          failed_at=_epoch(death.get("time")),
                          origin=f"queue {origin}" + (f", message_id {props.message_id}"
                                                      if props.message_id else ""),
                          body=body.decode("utf-8", "replace"), handle=origin)

    def letters(self) -> list[DeadLetter]:
        channel = self._channel()
        out = []
        try:
            while len(out) < MAX_LISTED:
                method, props, body = channel.basic_get(self.queue, auto_ack=False)
                if method is None:
                    break
                out.append(self._letter(props, body))
            if out:
                channel.basic_nack(delivery_tag=0, multiple=True, requeue=True)
        except amqp_errors.AMQPError as exc:
            raise DeadLetterError(f"{self.where}: {type(exc).__name__} {exc}") from None
        return out

    def replay(self, letters: list[DeadLetter], replayed: Replayed) -> str:
        wanted = Counter(d.key for d in letters)
        channel = self._channel()
        moved: Counter[str] = Counter()
        try:
            channel.tx_select()
            batch: list[tuple[str, str]] = []
            left = 0
            while sum(wanted.values()) > 0:
                method, props, body = channel.basic_get(self.queue, auto_ack=False)
                if method is None:
                    break
                letter = self._letter(props, body)
                if wanted[letter.key] <= 0:
                    left += 1                   # not chosen (another reason): stays
                    continue
                wanted[letter.key] -= 1
                headers = {k: v for k, v in (props.headers or {}).items()
                           if k not in DEATH_HEADERS}
                headers[REPLAYS] = int(headers.get(REPLAYS, 0)) + 1
                props.headers = headers
                channel.basic_publish("", letter.handle, body, props)
                channel.basic_ack(method.delivery_tag)
                batch.append((letter.key, letter.handle))
                if len(batch) >= PER_COMMIT:
                    self._commit(channel, batch, replayed, moved)
                    batch = []
            self._commit(channel, batch, replayed, moved)
            if left:
                # only now: a multiple nack would also take back acks not yet committed
                channel.basic_nack(delivery_tag=0, multiple=True, requeue=True)
                channel.tx_commit()
        except amqp_errors.AMQPError as exc:
            done = sum(moved.values())
            raise DeadLetterError(f"{self.where}: {type(exc).__name__} {exc}; {done} were "
                                  f"replayed before (the rest stay in the dead-letter "
                                  f"queue)") from None
        to = ", ".join(f"{n} to queue {q!r}" for q, n in sorted(moved.items()))
        missing = sum(wanted.values())
        return (f"replayed {to or 'none'} (moved out of {self.where})"
                + (f"; {missing} were gone meanwhile" if missing else ""))

    @staticmethod
    def _commit(channel: Any, batch: list[tuple[str, str]], replayed: Replayed,
                moved: Counter[str]) -> None:
        channel.tx_commit()
        for queue in {q for _k, q in batch}:
            replayed.record([k for k, q in batch if q == queue], f"queue {queue}")
        moved.update(q for _k, q in batch)

    def close(self) -> None:
        if self._conn is not None and self._conn.is_open:
            try:
                self._conn.close()
            except amqp_errors.AMQPError:
                pass
        self._conn = None
