"""The rabbitmq source in-process against the real RabbitMQ: every message acked exactly
once, failure policies, requeue, pause, broker-side connection loss, two consumers."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from offbroadway.stages.sources.rabbitmq import RabbitMQSource, mask_url, parse_options

from tests.brokers.conftest import (
    AMQP_URL,
    Rabbit,
    TcpProxy,
    consume,
    consume_until,
    unique,
)
from tests.conftest import wait_until

pytestmark = pytest.mark.broker


def make(queue: str, sources: Any, pipeline: str | None = None, **options: Any) -> Any:
    opts = {"url": AMQP_URL, "queue": queue, **options}
    src = RabbitMQSource(opts, pipeline=pipeline or unique("p"), producer_index=0,
                         producer_count=1)
    sources(src)
    src.open()
    return src


def ack_all(src: Any, seen: Counter | None = None) -> Any:
    def on_items(items: list) -> None:
        if seen is not None:
            seen.update(msg_id for msg_id, *_ in items)
        src.ack([h for *_, h in items])
    return on_items


def settled(src: Any) -> bool:
    s = src.stats()
    return s["unacked"] == 0 and s["buffered"] == 0 and s["requeues_pending"] == 0


def taken(rabbit: Rabbit, sources: Any, n: int, *, batch: int
          ) -> tuple[str, Any, list, list[str]]:
    """A fresh queue of ``n`` messages, all delivered to one source (prefetch ``n``) and
    fetched, none settled: the queue, the source, the items in delivery order and the
    message ids as published."""
    q = rabbit.queue()
    ids = rabbit.publish(q, n)
    src = make(q, sources, prefetch_count=n)
    items: list = []
    consume(src, n, items.extend, batch=batch)
    return q, src, items, ids


# -- options, without a broker round trip -------------------------------------------------
def test_options_defaults_and_errors() -> None:
    s = parse_options({"queue": "q"})
    assert (s.prefetch_count, s.prefetch_auto, s.on_failure, s.declare) == (
        50, True, "reject_and_requeue", False)
    assert parse_options({"queue": "q", "auto_prefetch": 120}).prefetch_count == 120
    assert parse_options({"queue": "q", "prefetch_count": 7,
                          "auto_prefetch": 120}).prefetch_count == 7
    d = parse_options({"queue": "q", "declare": {"x-dead-letter-exchange": "dlx",
                                                 "durable": False}})
    assert d.declare and not d.durable and d.queue_arguments == {"x-dead-letter-exchange": "dlx"}
    for bad, key in [({}, "queue"), ({"queue": "q", "prefetch_count": 0}, "prefetch_count"),
                     ({"queue": "q", "on_failure": "drop"}, "on_failure"),
                     ({"queue": "q", "bindings": [{"routing_key": "x"}]}, "bindings[0]"),
                     ({"queue": "q", "url": "http://x"}, "url"),
                     ({"queue": "q", "prefetch": 5}, "prefetch")]:
        with pytest.raises(ValueError, match=key.replace("[", r"\[")):
            RabbitMQSource.validate_options(bad)
    assert mask_url("amqp://guest:secret@h:5672/%2F") == "amqp://guest:***@h:5672/%2F"


def test_missing_queue_fails_at_open(sources: Any) -> None:
    with pytest.raises(RuntimeError, match="NOT_FOUND") as info:
        make(unique("absent"), sources, url="amqp://guest:guest@127.0.0.1:5672/%2F")
    assert "guest:***@" in str(info.value)


# -- the 10,000 message run -----------------------------------------------------------------
def test_ten_thousand_fetched_and_acked_once(rabbit: Rabbit, sources: Any) -> None:
    q = rabbit.queue()
    ids = rabbit.publish(q, 10_000)
    src = make(q, sources, prefetch_count=500)
    seen: Counter = Counter()
    bodies = set()

    def on_items(items: list) -> None:
        for msg_id, data, meta, _h in items:
            assert isinstance(data, bytes) and meta["routing_key"] == q
            assert meta["headers"]["i"] == int(data) and meta["message_id"] == msg_id
            bodies.add(data)
        ack_all(src, seen)(items)

    consume(src, 10_000, on_items, batch=250)
    assert set(seen) == set(ids) and max(seen.values()) == 1 and len(bodies) == 10_000
    wait_until(lambda: settled(src), timeout=20, message="every ack sent")
    wait_until(src.exhausted, timeout=20, message="exhausted() after the last ack")
    stats = src.stats()
    assert stats["acked"] == 10_000 and stats["fetched"] == 10_000 and stats["stale"] == 0
    src.close()
    # the broker agrees: nothing ready, nothing unacked came back at close
    assert rabbit.ready(q) == 0
    assert rabbit.take_all(q) == []


def test_exhausted_flips_back_when_a_message_arrives(rabbit: Rabbit, sources: Any) -> None:
    q = rabbit.queue()
    src = make(q, sources)
    wait_until(src.exhausted, timeout=20, message="empty queue seen as exhausted")
    rabbit.publish(q, 1)
    wait_until(lambda: not src.exhausted(), timeout=20, message="not exhausted")
    consume(src, 1, ack_all(src))
    wait_until(src.exhausted, timeout=20, message="exhausted again")


def test_a_requeue_is_not_exhausted_until_it_comes_back(rabbit: Rabbit, sources: Any) -> None:
    """The last message in flight (a poison about to be failed), the queue confirmed empty:
    the producer hands it back after a crash.  Until the I/O thread has sent that requeue
    the queue still looks empty to the probe, and an idle report then began the drain that
    left the message ready in the queue; from the requeue on, the source is not exhausted
    until the message came back and was settled."""
    q = rabbit.queue()
    rabbit.publish(q, 1)
    src = make(q, sources)
    got: list = []
    consume(src, 1, got.extend)
    wait_until(src.exhausted, timeout=20, message="in flight, the queue empty")
    src.requeue([h for *_, h in got])
    assert not src.exhausted()                     # at once, not after a probe
    again: list = []
    consume(src, 1, again.extend)
    assert [m for m, *_ in again] == [m for m, *_ in got]
    ack_all(src)(again)
    wait_until(src.exhausted, timeout=20, message="exhausted once it is settled")


# -- failure policies -----------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["reject", "reject_and_requeue_once", "requeue",
                                    "reject_and_requeue"])
def test_failure_policies(rabbit: Rabbit, sources: Any, policy: str) -> None:
    q = rabbit.queue(dlx=True)
    ids = rabbit.publish(q, 200)
    failing = {f"m{i}" for i in range(0, 200, 7)}
    src = make(q, sources, on_failure=policy, prefetch_count=50)
    deliveries: Counter = Counter()
    redelivered: Counter = Counter()
    requeues = policy in ("requeue", "reject_and_requeue")
    fail_each_time = not requeues

    def on_items(items: list) -> None:
        ok, bad = [], []
        for msg_id, _data, meta, h in items:
            deliveries[msg_id] += 1
            redelivered[msg_id] += meta["redelivered"]
            # "(reject_and_)requeue" fails the first delivery only, so it ends acked
            if msg_id in failing and (fail_each_time or deliveries[msg_id] == 1):
                bad.append((h, "handler failed"))
            else:
                ok.append(h)
        src.ack(ok)
        src.fail(bad)

    expected = 200 if policy == "reject" else 200 + len(failing)
    consume(src, expected, on_items, batch=20)
    wait_until(lambda: settled(src), timeout=20, message="settled")
    src.close()
    dead = rabbit.take_all(f"{q}.dlq")
    assert rabbit.ready(q) == 0 and set(deliveries) == set(ids)
    if requeues:
        assert dead == []
        assert all(deliveries[m] == 2 and redelivered[m] == 1 for m in failing)
    else:
        assert sorted(dead) == sorted(failing)          # exactly those, each once
        twice = policy == "reject_and_requeue_once"
        assert all(deliveries[m] == (2 if twice else 1) for m in failing)
    assert all(deliveries[m] == 1 for m in set(ids) - failing)


def test_requeue_redelivers(rabbit: Rabbit, sources: Any) -> None:
    q = rabbit.queue()
    ids = rabbit.publish(q, 30)
    src = make(q, sources, prefetch_count=10)
    first: list = []
    consume(src, 10, first.extend)
    src.requeue([h for *_, h in first])
    seen: Counter = Counter(m for m, *_ in first)
    again: list = []

    def on_items(items: list) -> None:
        again.extend(items)
        ack_all(src, seen)(items)

    consume(src, 30, on_items)
    assert set(seen) == set(ids)
    back = {m for m, _d, meta, _h in again if meta["redelivered"]}
    assert back == {m for m, *_ in first}
    wait_until(lambda: settled(src), timeout=20, message="settled")
    assert src.stats()["requeued"] == 10
    src.close()
    assert rabbit.ready(q) == 0


def test_pause_hands_buffered_back_and_resume_continues(rabbit: Rabbit,
                                                       sources: Any) -> None:
    q = rabbit.queue()
    ids = rabbit.publish(q, 100)
    src = make(q, sources, prefetch_count=20)
    wait_until(lambda: src.stats()["buffered"] == 20, timeout=20, message="window filled")
    src.pause()
    wait_until(lambda: src.stats()["returned"] == 20 and src.stats()["buffered"] == 0,
               timeout=20, message="buffered deliveries returned")
    wait_until(lambda: rabbit.ready(q) == 100, timeout=20, message="all ready again")
    assert src.fetch(10) == []
    src.resume()
    seen: Counter = Counter()
    consume(src, 100, ack_all(src, seen))
    assert set(seen) == set(ids)


# -- connection loss ------------------------------------------------------------------------
def test_broker_closes_the_connection(rabbit: Rabbit, sources: Any) -> None:
    q = rabbit.queue()
    ids = rabbit.publish(q, 2000)
    pipeline = unique("loss")
    src = make(q, sources, pipeline=pipeline, prefetch_count=100, backoff_min=0.05,
               backoff_max=0.5)
    seen: Counter = Counter()
    consume(src, 500, ack_all(src, seen))
    wait_until(lambda: src.stats()["acked"] == 500, timeout=20, message="500 acks sent")
    held: list = []
    consume(src, 50, held.extend)                    # in flight when the connection dies

    rabbit.close_connection(f"offbroadway {pipeline} producer_0")
    wait_until(lambda: src.stats()["reconnects"] == 1 and src.stats()["state"] == "connected",
               timeout=30, message="reconnected")
    assert src.stats()["last_error"]
    src.ack([h for *_, h in held])                  # from the dead connection: never sent
    wait_until(lambda: src.stats()["stale"] >= 50, timeout=20, message="stale acks dropped")

    redelivered: set = set()

    def on_items(items: list) -> None:
        redelivered.update(m for m, _d, meta, _h in items if meta["redelivered"])
        ack_all(src, seen)(items)

    consume_until(src, lambda: set(seen) >= set(ids) and settled(src) and src.exhausted(),
                  on_items, timeout=60)
    assert {m for m, *_ in held} <= redelivered       # the broker gave them back
    assert src.stats()["reconnects"] == 1             # no channel error (double ack) since
    src.close()
    assert rabbit.ready(q) == 0 and rabbit.take_all(q) == []


# -- horizontal scale -----------------------------------------------------------------------
def test_two_consumers_split_the_queue(rabbit: Rabbit, sources: Any) -> None:
    q = rabbit.queue()
    ids = rabbit.publish(q, 2000)
    a = make(q, sources, prefetch_count=50)
    b = make(q, sources, prefetch_count=50)
    got: dict[str, Counter] = {"a": Counter(), "b": Counter()}
    wait_until(lambda: a.stats()["buffered"] and b.stats()["buffered"], timeout=20,
               message="both consumers have deliveries")

    def total() -> int:
        for key, src in (("a", a), ("b", b)):
            items = src.fetch(25)
            got[key].update(m for m, *_ in items)
            src.ack([h for *_, h in items])
        return sum(sum(c.values()) for c in got.values())

    wait_until(lambda: total() >= 2000, timeout=60, interval=0.001,
               message="2000 messages between the two")
    assert not set(got["a"]) & set(got["b"])             # nobody handled one twice
    assert set(got["a"]) | set(got["b"]) == set(ids)
    assert max(got["a"].values()) == max(got["b"].values()) == 1
    assert min(len(got["a"]), len(got["b"])) > 200       # both did real work


def test_unreachable_at_start_then_network_drop(rabbit: Rabbit, sources: Any) -> None:
    """The broker is unreachable when the daemon starts (open() must not fail, only
    retry), then the network drops mid-run with deliveries in flight (no close frame at
    all, unlike rabbitmqctl): both times the source reconnects and nothing is lost."""
    q = rabbit.queue()
    ids = rabbit.publish(q, 1000)
    proxy = TcpProxy(5672)
    proxy.down()
    try:
        src = make(q, sources, url=f"amqp://guest:guest@127.0.0.1:{proxy.port}/%2F",
                   prefetch_count=100, backoff_min=0.02, backoff_max=0.2, connect_timeout=2)
        assert src.stats()["state"] in ("reconnecting", "connecting")
        assert src.fetch(10) == [] and not src.exhausted()
        proxy.up()
        seen: Counter = Counter()
        consume(src, 400, ack_all(src, seen))
        wait_until(lambda: src.stats()["acked"] == 400, timeout=20, message="acks sent")
        held: list = []
        consume(src, 50, held.extend)
        proxy.down()
        wait_until(lambda: src.stats()["state"] != "connected", timeout=20,
                   message="the drop noticed")
        proxy.up()
        wait_until(lambda: src.stats()["state"] == "connected", timeout=30,
                   message="reconnected through the proxy")
        src.ack([h for *_, h in held])                # stale: never sent on the new channel
        consume_until(src, lambda: set(seen) == set(ids) and settled(src) and src.exhausted(),
                      ack_all(src, seen), timeout=60)
        assert src.stats()["stale"] >= 50
        src.close()
        assert rabbit.ready(q) == 0
    finally:
        proxy.down()


# -- acks as multiple acks --------------------------------------------------------------------
def test_out_of_order_acks_go_as_one_multiple_ack(rabbit: Rabbit, sources: Any) -> None:
    """Two processors finish their frames in either order: the second half settled before
    the first still makes one ``multiple`` ack frame, not 500 single ones."""
    q, src, items, _ = taken(rabbit, sources, 1000, batch=1000)
    handles = [h for *_, h in items]
    src.ack(handles[500:] + handles[:500])
    wait_until(lambda: src.stats()["acked"] == 1000 and src.stats()["acks_pending"] == 0,
               timeout=20, message="every ack sent")
    assert src.stats()["ack_frames"] == 1
    assert src.stats()["acked"] == 1000
    src.close()
    assert rabbit.take_all(q) == []


def test_acks_behind_a_long_job_are_not_held(rabbit: Rabbit, sources: Any) -> None:
    """The first message is still running: the acks behind it go out on their own (after
    ``_ACK_DELAY``) instead of waiting for it, and only it comes back at close."""
    q, src, items, _ = taken(rabbit, sources, 300, batch=300)
    assert items[0][0] == "m0"
    src.ack([h for *_, h in items[1:]])
    wait_until(lambda: src.stats()["acked"] == 299 and src.stats()["acks_pending"] == 0,
               timeout=20, message="the acks behind the open tag sent")
    stats = src.stats()
    assert (stats["acked"], stats["unacked"], stats["ack_frames"]) == (299, 1, 299)
    src.close()
    assert rabbit.take_all(q) == ["m0"]


def test_requeuing_policy_rejects_what_would_only_fail_again(rabbit: Rabbit,
                                                             sources: Any) -> None:
    """Under the default reject_and_requeue, a poison message (its reason from the poison
    guard) and an oversized body go to the dead-letter exchange: requeued they would come
    back to crash or fail for ever.  An ordinary failure is requeued."""
    import pika
    from offbroadway.stages.poison.guard import POISON_REASON
    from offbroadway.stages.sources.base import failure_of

    q = rabbit.queue(dlx=True)
    rabbit.publish(q, 3)
    rabbit.ch.basic_publish("", q, b"x" * 2000, pika.BasicProperties(message_id="big"))
    src = make(q, sources, prefetch_count=10, max_message_bytes=1000)
    assert src.settings.on_failure == "reject_and_requeue"
    got: dict = {}
    consume(src, 4, lambda items: got.update({it[0]: (failure_of(it), it[3]) for it in items}))
    assert "over max_message_bytes" in got["big"][0]
    src.fail([(got["m0"][1], f"{POISON_REASON}killed a processor 3 times (last: x)"),
              (got["m1"][1], "handle_message raised ValueError: try again"),
              (got["big"][1], got["big"][0])])
    src.ack([got["m2"][1]])
    again: list = []
    consume(src, 1, again.extend)
    assert [m for m, *_ in again] == ["m1"] and again[0][2]["redelivered"]
    src.ack([again[0][3]])
    wait_until(lambda: settled(src), timeout=20, message="settled")
    assert src.stats()["rejected_final"] == 2
    assert sorted(rabbit.take_all(f"{q}.dlq")) == ["big", "m0"]
    assert rabbit.ready(q) == 0


# -- requeues in bulk -------------------------------------------------------------------------
def test_a_crashed_window_goes_back_in_one_frame(rabbit: Rabbit, sources: Any) -> None:
    """A stage died holding the whole window: its deliveries, handed back in the order the
    stages' records give them (not the delivery order), go back as one ``basic.nack``
    (multiple, requeue), not 20,000 ``basic.reject`` frames the broker takes minutes over,
    and every one is delivered again."""
    import random
    q, src, items, ids = taken(rabbit, sources, 20_000, batch=2_000)
    handles = [h for *_, h in items]
    random.Random(7).shuffle(handles)
    for start in range(0, len(handles), 3_000):      # as the producer's requeue reports come
        src.requeue(handles[start:start + 3_000])
    seen: Counter = Counter()
    consume(src, 20_000, ack_all(src, seen), batch=2_000, timeout=30)
    assert seen == Counter(ids)
    stats = src.stats()
    assert (stats["requeued"], stats["redelivered"]) == (20_000, 20_000)
    # the I/O thread may take the seven reports in one pass or several: at most a frame
    # for each pass's run at the front, never one a delivery
    assert 1 <= stats["requeue_frames"] <= 7
    wait_until(lambda: settled(src), timeout=20, message="settled")
    src.close()
    assert rabbit.ready(q) == 0


def test_requeues_behind_a_live_job_wait_for_the_front(rabbit: Rabbit, sources: Any) -> None:
    """The dead stage's deliveries sit between a live stage's: they wait until the front
    reaches them, then go as one frame; the live ones before and after are acked, and
    only the dead stage's come back.  The acks behind them wait too: a single ack behind
    1,000 open deliveries costs the broker a walk over them (docs/sources.md)."""
    q, src, items, _ = taken(rabbit, sources, 3_000, batch=1_000)
    handles = [h for *_, h in items]
    src.requeue(handles[1_000:2_000])
    src.ack(handles[2_000:])
    wait_until(lambda: src.stats()["acked"] == 1_000, timeout=20,
               message="the I/O thread taking the acks")
    stats = src.stats()
    # still owed (that too many never go singly is tests/sources/test_rabbitmq_settle.py's)
    assert (stats["requeues_pending"], stats["acks_pending"], stats["redelivered"],
            stats["ack_frames"]) == (1_000, 1_000, 0, 0)
    src.ack(handles[:1_000])
    again: list = []
    consume(src, 1_000, again.extend, batch=1_000)
    assert sorted(m for m, *_ in again) == sorted(m for m, *_ in items[1_000:2_000])
    assert all(meta["redelivered"] for _m, _d, meta, _h in again)
    # the front's acks, the requeues, the acks behind them: a multiple frame each
    assert (src.stats()["requeue_frames"], src.stats()["ack_frames"]) == (1, 2)
    src.ack([h for *_, h in again])
    wait_until(lambda: settled(src), timeout=20, message="settled")
    src.close()
    assert rabbit.ready(q) == 0


def test_a_few_requeues_behind_a_long_job_go_one_by_one(rabbit: Rabbit,
                                                        sources: Any) -> None:
    """A crashed processor's few messages (a poison message's next strike among them)
    are not held by a long job at the front: after ``REQUEUE_DELAY`` they go singly."""
    q, src, items, _ = taken(rabbit, sources, 100, batch=100)
    assert items[0][0] == "m0"
    src.requeue([h for *_, h in items[1:11]])
    again: list = []
    consume(src, 10, again.extend, batch=10)
    assert sorted(m for m, *_ in again) == sorted(m for m, *_ in items[1:11])
    stats = src.stats()
    assert (stats["requeue_frames"], stats["requeues_pending"]) == (10, 0)
    src.ack([h for *_, h in items[11:] + again])
    src.close()
    assert rabbit.take_all(q) == ["m0"]
