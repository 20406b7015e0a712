"""Running the user's callbacks on a group of messages: the pure core of the stages.

The processor and batch-processor stages call these on each frame, and
:mod:`offbroadway.testing` calls the very same functions in-process, so what a user's unit
test sees is what the pipeline does.  A callback that raises fails the messages concerned;
nothing here ever raises because of user code.  That includes ``SystemExit``
(``sys.exit()`` in a callback): Broadway fails the message for an ``exit`` in a callback,
and a stage that died of it would be restarted and die again on the redelivery.  Only a
process that really dies (``os._exit``, a signal) is left to the poison guard.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from offbroadway import BatchInfo, Message, Pipeline
from offbroadway.message import DISCARD

from .spec import PROCESSOR_KEY


class MessageTimeout(BaseException):
    """A callback call ran past ``message_timeout``: raised inside it by the stage's
    liveness thread (:mod:`.liveness`).  Not an ``Exception``, so that a handler's own
    ``except Exception`` around a slow call does not swallow it."""


#: what a callback can raise that fails its messages: any Exception, SystemExit, and the
#: deadline of one call
CALLBACK_ERRORS = (Exception, SystemExit, MessageTimeout)
#: the base class's pass-through: it cannot kill a process, so no frame record before it
_BASE_PREPARE = Pipeline.prepare_messages


def fail_all(messages: Iterable[Message], exc: BaseException, where: str) -> None:
    reason = f"{where} raised {type(exc).__name__}: {exc}"
    for m in messages:
        m.status = reason


class Blame(Protocol):
    """Where a processor records what it is running (:class:`..blame.BlameRecorder`)."""

    def message(self, m: Message) -> None: ...

    def indexes(self, messages: list[Message]) -> Any: ...

    def frame(self, messages: list[Message]) -> None: ...

    def idle(self) -> None: ...


def process(handler: Pipeline, messages: list[Message], context: Any,
            batchers: frozenset[str] | set[str] = frozenset(), blame: Blame | None = None,
            healthy: bool = False) -> tuple[list[Message], list[Message], list[Message]]:
    """``prepare_messages`` then ``handle_message`` on each: (done, failed, discarded).

    ``discarded`` are the messages the handler discarded (:meth:`Message.discard`) while
    there are batchers: the caller acks them at once, they go to no batcher.  Without
    batchers a discarded message is simply done (acked after ``handle_message`` anyway).
    Messages that arrive already failed (a spool line that is not JSON, a poison message)
    skip the callbacks (``healthy``: the caller knows none did, e.g. from its frame).
    With batchers, a message routed to an unknown batcher fails with a
    clear reason.  ``blame`` is told what runs before each callback that could kill the
    process, so a message that does is known after the process is gone.  The record is
    cleared only on return: whatever escapes (nothing a callback raises does) leaves it for
    the daemon to read after the process died.
    """
    failed = [m for m in messages if m.status is not None] if not healthy else []
    ok = [m for m in messages if m.status is None] if failed else messages
    if blame is not None:
        out = _process(handler, ok, failed, context, batchers, blame)
        blame.idle()
        return out
    return _process(handler, ok, failed, context, batchers, None)


def _process(handler: Pipeline, ok: list[Message], failed: list[Message], context: Any,
             batchers: frozenset[str] | set[str], blame: Blame | None
             ) -> tuple[list[Message], list[Message], list[Message]]:
    # the base class's pass-through returns its input: nothing to call or check
    if ok and getattr(type(handler), "prepare_messages", _BASE_PREPARE) is not _BASE_PREPARE:
        if blame is not None:
            blame.frame(ok)
        given = ok
        try:
            ok = handler.prepare_messages(ok, context)
            problem = _prepared_problem(given, ok)
        except CALLBACK_ERRORS as exc:
            fail_all(given, exc, "prepare_messages")
            failed.extend(given)
            ok = []
        else:
            if problem:
                # Broadway's contract: as many messages as it was given.  One left out would
                # stay in flight forever; the whole group fails, as Broadway fails it.
                for m in given:
                    m.status = f"prepare_messages {problem}"
                failed.extend(given)
                ok = []
            else:
                for g, p in zip(given, ok):
                    if p is not g:
                        _stands_in(p, g)
    done: list[Message] = []
    discarded: list[Message] = []
    handle = handler.handle_message
    # the blame: with the frame's own messages, in order (the usual case), each one's
    # place written straight into the record; else the record is told each message
    store = blame.indexes(ok) if blame is not None else None
    mark = blame.message if blame is not None and store is None else None
    for i, m in enumerate(ok):
        if store is not None:
            store[0] = i
        elif mark is not None:
            mark(m)
        try:
            r = handle(PROCESSOR_KEY, m, context)
        except CALLBACK_ERRORS as exc:
            m.status = f"handle_message raised {type(exc).__name__}: {exc}"
            failed.append(m)
            continue
        if r.__class__ is not Message and not isinstance(r, Message):
            m.status = f"handle_message returned {type(r).__name__}, not a Message"
            failed.append(m)
            continue
        if r is not m:
            _stands_in(r, m)
        if r.status is not None:
            failed.append(r)
        elif batchers and r.batcher not in batchers:
            if r.batcher == DISCARD:
                discarded.append(r)
                continue
            r.status = f"unknown batcher {r.batcher!r} (configured: {sorted(batchers)})"
            failed.append(r)
        else:
            done.append(r)
    return done, failed, discarded


def _stands_in(new: Message, given: Message) -> None:
    """A callback returned a message it built (``Message(m.id, new_data)``) where it was
    given one: the new message stands in for the given one, so it takes the given one's
    delivery envelope.  Without it the new message would be acked to nobody (its envelope
    empty) and the given one would stay in flight for ever."""
    new._origin = given._origin
    new._token = given._token


def _prepared_problem(given: list[Message], prepared: object) -> str | None:
    """What is wrong with ``prepare_messages``' result, or None: it must be a list of as
    many messages as it was given (Broadway raises "expected all messages to be returned")."""
    if not isinstance(prepared, list):
        return f"returned {type(prepared).__name__}, not a list of messages"
    if len(prepared) != len(given):
        return (f"returned {len(prepared)} messages for the {len(given)} it was given "
                f"(it must return every message, in order)")
    for m in prepared:
        if not isinstance(m, Message):
            return f"returned a {type(m).__name__} among the messages"
    return None


def handle_batch(handler: Pipeline, batcher: str, messages: list[Message], info: BatchInfo,
                 context: Any) -> list[Message]:
    """``handle_batch``: the messages to write (or, without Spark, the ones done).

    Afterwards every input message is either in the result with no failure, or failed:
    a message the callback leaves out is failed ("not returned by handle_batch") rather
    than silently dropped or silently acked.
    """
    try:
        result = handler.handle_batch(batcher, messages, info, context)
        if not isinstance(result, list):
            raise TypeError(f"handle_batch returned {type(result).__name__}, not a list")
    except CALLBACK_ERRORS as exc:
        fail_all(messages, exc, "handle_batch")
        return []
    if result is messages and all(issubclass(t, Message) for t in set(map(type, result))):
        # ``return messages``, the usual case: every input is in the result (messages off
        # the wire are of Message's lazy subclass)
        return [m for m in result if m.status is None]
    returned = {id(m) for m in result}
    for m in messages:
        if id(m) not in returned and m.status is None:
            m.status = "not returned by handle_batch"
    return [m for m in result if isinstance(m, Message) and m.status is None]


def handle_failed(handler: Pipeline, failed: Sequence[Message], context: Any) -> list[Message]:
    """Show failed messages to ``handle_failed``; all of them stay failed, whatever it returns
    (a message it leaves out must not stay in flight forever)."""
    try:
        handler.handle_failed(list(failed), context)
    except CALLBACK_ERRORS as exc:
        for m in failed:
            m.status = f"{m.status}; handle_failed raised {type(exc).__name__}: {exc}"
    for m in failed:
        if m.status is None:
            m.status = "failed"
    return list(failed)
