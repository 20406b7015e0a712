"""The RabbitMQ source's settlement core on a recording channel, with the clock given:
which frames a mix of acks, requeues and rejects becomes.  The real broker's side (the
deliveries really come back) is in tests/brokers/test_rabbitmq_source.py."""

from __future__ import annotations

from offbroadway.stages.sources.rabbitmq.delivery import RabbitMQHandle
from offbroadway.stages.sources.rabbitmq.settle import (
    ACK_DELAY,
    REQUEUE_DELAY,
    SINGLE_ACK_AHEAD,
    SINGLE_REQUEUES,
    Settlement,
)


class Channel:
    """pika's settling calls, recorded as (frame, tag, multiple)."""

    def __init__(self) -> None:
        self.frames: list[tuple[str, int, bool]] = []

    def basic_ack(self, tag: int, multiple: bool = False) -> None:
        self.frames.append(("ack", tag, multiple))

    def basic_nack(self, tag: int, multiple: bool = False, requeue: bool = True) -> None:
        assert requeue
        self.frames.append(("nack", tag, multiple))

    def basic_reject(self, tag: int, requeue: bool = True) -> None:
        self.frames.append(("requeue" if requeue else "reject", tag, False))


def delivered(n: int) -> tuple[Settlement, Channel, list[RabbitMQHandle]]:
    settle, channel = Settlement("reject_and_requeue"), Channel()
    settle.attach(channel, 1)
    for tag in range(1, n + 1):
        settle.delivered(tag)
    return settle, channel, [RabbitMQHandle(1, tag, False) for tag in range(1, n + 1)]


def test_runs_at_the_front_become_one_frame_each() -> None:
    settle, channel, h = delivered(10)
    settle.requeue([h[3], h[2], h[4]])       # tags 3-5, in a stage's order
    settle.ack(h[:2] + h[5:8])               # tags 1-2 and 6-8
    settle.fail([(h[8], "bad")])             # tag 9: requeued at once, on its own
    assert channel.frames == [("requeue", 9, False)]
    settle.send_acks(now=1.0)
    assert channel.frames[1:] == [("ack", 2, True), ("nack", 5, True), ("ack", 8, True)]
    assert (settle.requeue_owed, settle.unsent, settle.open_tags) == (set(), {}, {10})
    assert (settle.requeued, settle.requeue_frames, settle.ack_frames) == (3, 1, 2)


def test_many_requeues_behind_an_open_tag_wait_for_the_front() -> None:
    settle, channel, h = delivered(1_000)
    settle.requeue(h[1:500])
    later = settle._requeue_since + REQUEUE_DELAY * 100
    settle.send_acks(now=later)
    assert channel.frames == [] and len(settle.requeue_owed) == 499
    settle.ack([h[0]])
    settle.send_acks(now=later + 1)
    assert channel.frames == [("ack", 1, True), ("nack", 500, True)]
    assert not settle.owed


def test_a_few_requeues_behind_an_open_tag_go_singly_after_the_delay() -> None:
    settle, channel, h = delivered(100)
    settle.requeue(h[1:1 + SINGLE_REQUEUES])
    since = settle._requeue_since
    assert settle.send_acks(now=since + REQUEUE_DELAY / 2) > 0
    assert channel.frames == []
    settle.send_acks(now=since + REQUEUE_DELAY)
    assert channel.frames == [("requeue", t, False) for t in range(2, 2 + SINGLE_REQUEUES)]
    assert not settle.owed and settle.open_tags == {1} | set(range(2 + SINGLE_REQUEUES, 101))


def test_acks_behind_one_slow_delivery_go_singly_after_the_delay() -> None:
    """A long job at the front does not hold the others' acks (nor their window)."""
    settle, channel, h = delivered(100)
    settle.ack(h[1:])
    since = settle._unsent_since
    settle.send_acks(now=since + ACK_DELAY / 2)
    assert channel.frames == []
    settle.send_acks(now=since + ACK_DELAY)
    assert channel.frames == [("ack", t, False) for t in range(2, 101)]
    assert settle.open_tags == {1} and not settle.unsent


def test_acks_behind_many_open_deliveries_wait_for_the_front() -> None:
    """The broker walks the open deliveries before a single ack's tag: behind more than
    SINGLE_ACK_AHEAD, acks wait for the front, then go as one multiple ack.  Those behind
    only a few open tags still go singly."""
    n = 2_000
    settle, channel, h = delivered(n)
    # a batch's stragglers: tags 11-10+SINGLE_ACK_AHEAD+1 open, then 1,000 settled
    front = 10 + SINGLE_ACK_AHEAD + 1
    settle.ack(h[:10] + h[front:front + 1_000])
    settle.send_acks(now=1.0)
    assert channel.frames == [("ack", 10, True)]
    settle.send_acks(now=1.0 + ACK_DELAY * 10)
    assert channel.frames == [("ack", 10, True)], "acks sent behind too many open tags"
    assert len(settle.unsent) == 1_000
    # all but SINGLE_ACK_AHEAD of the stragglers settle: what waits behind them goes singly
    settle.ack(h[10:10 + SINGLE_ACK_AHEAD // 2])
    settle.send_acks(now=2.0)
    assert channel.frames[1] == ("ack", 10 + SINGLE_ACK_AHEAD // 2, True)
    settle.send_acks(now=2.0 + ACK_DELAY)
    singles = channel.frames[2:]
    assert singles == [("ack", t, False) for t in range(front + 1, front + 1_001)]
    # the front settles: the rest goes as runs, nothing twice
    settle.ack(h[10 + SINGLE_ACK_AHEAD // 2:front] + h[front + 1_000:])
    settle.send_acks(now=3.0)
    assert channel.frames[-1] == ("ack", n, True) and not settle.owed
    assert settle.ack_frames == len(channel.frames)


def test_a_lost_connection_forgets_what_was_owed() -> None:
    """The broker requeues all a dead channel held: nothing owed is sent on the next."""
    settle, channel, h = delivered(10)
    settle.requeue(h[:5])
    settle.attach(Channel(), 2)
    settle.send_acks(now=10.0, force=True)
    assert channel.frames == [] and not settle.owed
    settle.requeue(h[5:])                    # handles of the dead incarnation: stale
    assert (settle.requeued, settle.stale) == (5, 5)


def test_failure_books_note_what_a_sibling_producer_may_hold_and_take_its_word() -> None:
    """Notes go to the daemon for failures requeued and redelivered messages settled, not
    for first deliveries acked; the daemon's word drops or hands over what is known."""
    from offbroadway.stages.wire.commands import NOTE_FAILED, NOTE_SETTLED

    settle, _channel, _ = delivered(4)
    first = [RabbitMQHandle(1, t, False, key=f"m{t}") for t in (1, 2, 3)]
    settle.ack([first[0]])
    assert not settle.notes                              # the hot path notes nothing
    settle.fail([(first[1], "bad"), (first[2], "bad")])  # requeued: m2 and m3 failing
    assert [(k, d) for k, d, _ in settle.notes] == [(NOTE_FAILED, hash("m2")),
                                                    (NOTE_FAILED, hash("m3"))]
    at = settle.notes[-1][2]
    settle.notes.clear()
    assert (settle.failed, len(settle.failing)) == (2, 2)
    settle.reconcile([[hash("m2"), at + 1]], [[hash("m3"), at + 1]])
    # m2 went through on a sibling; m3 failed again there: known here, counted there
    assert (settle.failed, settle.counted, set(settle.failing)) == (0, 0, {"m3"})
    settle.reconcile([[hash("m3"), at - 1]], [])      # older than our failure: stale
    assert set(settle.failing) == {"m3"}
    settle.delivered(5)
    settle.redelivered_open.add(5)                     # m3 back, redelivered, acked here
    settle.ack([RabbitMQHandle(1, 5, True, key="m3")])
    assert not settle.failing and not settle.redelivered_open
    assert [(k, d) for k, d, _ in settle.notes] == [(NOTE_SETTLED, hash("m3"))]


def test_a_delivery_dispatched_while_acks_go_out_singly_is_kept() -> None:
    """pika's BlockingChannel flushes each frame with a pass over the socket, which can
    dispatch a delivery (it joins the delivery order) while single acks are sent."""
    settle, channel, h = delivered(10)
    more = iter(range(11, 20))

    def ack(tag: int, multiple: bool = False) -> None:
        channel.frames.append(("ack", tag, multiple))
        settle.delivered(next(more))

    channel.basic_ack = ack   # type: ignore[method-assign]
    settle.ack(h[1:])
    settle.send_acks(now=settle._unsent_since + ACK_DELAY)
    assert channel.frames == [("ack", t, False) for t in range(2, 11)]
    assert settle.open_tags == {1, *range(11, 20)} and not settle.unsent
