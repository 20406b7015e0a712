"""The nats (JetStream) source in-process against the real server: every message acked
exactly once within the window, nak with delay then dead letter or term at max_deliver,
requeue, pause, two consumers of one durable, a slow holder keeps what it holds."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

pytest.importorskip("nats", reason="the brokers extra (nats-py) is not installed")

from offbroadway.stages.sources.base import SourceOptionError
from offbroadway.stages.sources.nats import NatsSource
from offbroadway.stages.sources.nats.connection import DEAD_LETTER_HEADER
from offbroadway.stages.sources.nats.settings import parse_options

from tests.brokers.conftest import consume, consume_until
from tests.brokers.natsutil import NATS_URL
from tests.conftest import wait_until

pytestmark = pytest.mark.broker


def make(stream: str, sources: Any, *, consumer: str = "c", **options: Any) -> NatsSource:
    opts: dict[str, Any] = {"url": NATS_URL, "stream": stream, "consumer": consumer,
                            "prefetch": 200, **options}
    src = NatsSource(opts, pipeline="p")
    sources(src)
    src.open()
    return src


def bodies(n: int) -> list[bytes]:
    return [str(i).encode() for i in range(n)]


def settled(jet: Any, stream: str, consumer: str = "c") -> bool:
    info = jet.consumer(stream, consumer)
    return info.num_pending == 0 and info.num_ack_pending == 0


def test_options_defaults_and_errors() -> None:
    s = parse_options({"stream": "orders"}, pipeline="pipe")
    assert (s.consumer, s.prefetch, s.prefetch_auto, s.max_deliver) == ("pipe", 50, True, 5)
    assert parse_options({"stream": "o", "prefetch": "auto", "auto_prefetch": 321}).prefetch \
        == 321
    for bad, key in [({}, "stream"), ({"stream": "a.b"}, "stream"),
                     ({"stream": "s", "url": "amqp://x"}, "url"),
                     ({"stream": "s", "prefetch": 0}, "prefetch"),
                     ({"stream": "s", "prefetch": "lots"}, "prefetch"),
                     ({"stream": "s", "max_deliver": 0}, "max_deliver"),
                     ({"stream": "s", "nak_delay": -1}, "nak_delay"),
                     ({"stream": "s", "create_consumer": "yes"}, "create_consumer"),
                     ({"stream": "s", "prefech": 5}, "prefech")]:
        with pytest.raises(SourceOptionError) as err:
            NatsSource.validate_options(bad)
        assert err.value.option == key, (bad, err.value)


def test_missing_stream_fails_at_open(sources: Any) -> None:
    with pytest.raises(RuntimeError, match="does not exist"):
        make("obtest-no-such-stream", sources)


def test_missing_consumer_without_create_fails_at_open(jet: Any, sources: Any) -> None:
    stream = jet.stream()
    with pytest.raises(RuntimeError, match="create_consumer is false"):
        make(stream, sources, create_consumer=False)


def test_ten_thousand_fetched_and_acked_once_within_the_window(jet: Any, sources: Any) -> None:
    stream = jet.stream()
    ids = jet.publish(stream, bodies(10_000))
    src = make(stream, sources, prefetch=300)
    seen: Counter = Counter()
    most_owed = 0

    def on_items(items: list) -> None:
        nonlocal most_owed
        most_owed = max(most_owed, src.stats()["unacked"])
        seen.update(msg_id for msg_id, *_ in items)
        src.ack([h for *_, h in items])

    consume(src, 10_000, on_items)
    assert set(seen) == set(ids) and max(seen.values()) == 1
    assert most_owed <= 300, most_owed
    wait_until(lambda: settled(jet, stream), timeout=10, message="every message acked")
    wait_until(src.exhausted, timeout=10, message="exhausted once all is acked")
    stats = src.stats()
    assert (stats["acked"], stats["unacked"], stats["stale"]) == (10_000, 0, 0)


def test_exhausted_is_false_while_a_nak_delayed_message_will_come_back(
        jet: Any, sources: Any) -> None:
    stream = jet.stream()
    jet.publish(stream, [b"x"])
    src = make(stream, sources, nak_delay=1.5)
    items: list = []
    consume(src, 1, items.extend)
    src.fail([(items[0][3], "try later")])
    t0 = time.monotonic()
    while time.monotonic() - t0 < 1.0:
        assert not src.exhausted()
        time.sleep(0.05)
    again: list = []
    consume(src, 1, again.extend, timeout=10)
    assert again[0][0] == items[0][0] and again[0][2]["delivered"] == 2
    assert time.monotonic() - t0 >= 1.4        # the server held it for nak_delay
    src.ack([again[0][3]])
    wait_until(src.exhausted, timeout=10, message="exhausted after the ack")


def test_failures_are_retried_then_dead_lettered_exactly_once(jet: Any, sources: Any) -> None:
    stream = jet.stream(dead_letter=True)
    ids = jet.publish(stream, bodies(50))
    src = make(stream, sources, max_deliver=3, nak_delay=0.05,
               dead_letter_subject=f"{stream}-dead.orders")
    deliveries: Counter = Counter()

    def on_items(items: list) -> None:
        ok, bad = [], []
        for msg_id, data, meta, handle in items:
            deliveries[msg_id] += 1
            assert meta["delivered"] == deliveries[msg_id]
            (bad.append((handle, f"bad {data!r}")) if int(data) % 10 == 3 else ok.append(handle))
        src.ack(ok)
        src.fail(bad)

    consume_until(src, lambda: settled(jet, stream), on_items, timeout=30)
    failing = {f"m{i}" for i in range(50) if i % 10 == 3}
    assert {m for m, n in deliveries.items() if n > 1} == failing
    assert all(deliveries[m] == 3 for m in failing)
    assert all(deliveries[m] == 1 for m in set(ids) - failing)
    dead = jet.messages(f"{stream}-dead")
    assert sorted(m.headers["Nats-Msg-Id"] for m in dead) == sorted(failing)
    for m in dead:
        assert m.headers[f"{DEAD_LETTER_HEADER}-Reason"] == f"bad {m.data!r}"
        assert m.headers[f"{DEAD_LETTER_HEADER}-Delivered"] == "3"
        assert m.headers[f"{DEAD_LETTER_HEADER}-Subject"] == f"{stream}.in"
    stats = src.stats()
    assert (stats["dead_lettered"], stats["terminated"], stats["naked"]) == (5, 5, 10)
    # messages, not deliveries: 5 failed (each three times: 15 failed deliveries, 10 nak'ed)
    assert (stats["failed"], stats["failures"], stats["failing"]) == (5, 15, 0)
    assert (stats["rejected"], stats["failure_requeued"]) == (5, 10)


def test_without_a_dead_letter_subject_the_last_failure_terms(jet: Any, sources: Any) -> None:
    stream = jet.stream()
    jet.publish(stream, [b"poison"])
    src = make(stream, sources, max_deliver=1)
    items: list = []
    consume(src, 1, items.extend)
    src.fail([(items[0][3], "no")])
    wait_until(lambda: settled(jet, stream), timeout=10, message="terminated")
    time.sleep(0.5)        # and it does not come back: a fetch after the term stays empty
    assert src.fetch(10) == []
    assert src.stats()["terminated"] == 1


def test_requeue_redelivers_at_once(jet: Any, sources: Any) -> None:
    stream = jet.stream()
    ids = jet.publish(stream, bodies(100))
    src = make(stream, sources)
    first: list = []
    consume(src, 100, first.extend)
    src.requeue([h for *_, h in first])
    second: list = []
    consume(src, 100, second.extend, timeout=10)
    assert sorted(m for m, *_ in second) == sorted(ids)
    assert all(meta["redelivered"] for _, _, meta, _ in second)
    src.ack([h for *_, h in second])
    src.ack([h for *_, h in first])        # stale: settled already by the requeue
    wait_until(lambda: settled(jet, stream), timeout=10, message="all acked")
    assert src.stats()["stale"] == 100


def test_pause_hands_unfetched_back_and_resume_continues(jet: Any, sources: Any) -> None:
    stream = jet.stream()
    ids = jet.publish(stream, bodies(500))
    src = make(stream, sources, prefetch=100)
    got: list = []
    consume(src, 10, got.extend)
    wait_until(lambda: src.stats()["buffered"] > 0, timeout=10, message="a buffer to return")
    src.pause()
    wait_until(lambda: src.stats()["unacked"] == 10, timeout=10,
               message="only the fetched ten still owed")
    assert src.fetch(100) == []
    src.resume()
    src.ack([h for *_, h in got])

    def on_items(items: list) -> None:       # within the window of 100: ack as we go
        got.extend(items)
        src.ack([h for *_, h in items])

    consume(src, 490, on_items, timeout=30)
    assert sorted(m for m, *_ in got) == sorted(ids)
    wait_until(lambda: settled(jet, stream), timeout=10, message="all acked")


def test_two_sources_on_one_durable_split_without_doubles(jet: Any, sources: Any) -> None:
    stream = jet.stream()
    ids = jet.publish(stream, bodies(4000))
    a, b = make(stream, sources, prefetch=50), make(stream, sources, prefetch=50)
    seen: dict[str, Counter] = {"a": Counter(), "b": Counter()}
    import threading

    def run(name: str, src: NatsSource) -> None:
        def on_items(items: list) -> None:
            seen[name].update(m for m, *_ in items)
            time.sleep(0.002)
            src.ack([h for *_, h in items])
        consume_until(src, lambda: sum(map(len, seen.values())) >= 4000, on_items,
                      batch=10, timeout=60)

    threads = [threading.Thread(target=run, args=x) for x in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert set(seen["a"]) | set(seen["b"]) == set(ids)
    assert not set(seen["a"]) & set(seen["b"])
    assert max((seen["a"] + seen["b"]).values()) == 1
    assert len(seen["a"]) > 400 and len(seen["b"]) > 400, (len(seen["a"]), len(seen["b"]))
    wait_until(lambda: settled(jet, stream), timeout=10, message="all acked")


def test_a_live_slow_holder_keeps_its_messages_past_ack_wait(jet: Any, sources: Any) -> None:
    stream = jet.stream()
    jet.publish(stream, bodies(5))
    slow = make(stream, sources, ack_wait=1.5)
    held: list = []
    consume(slow, 5, held.extend)
    other = make(stream, sources, ack_wait=1.5)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 4.5:          # three ack_waits
        assert other.fetch(10) == [], "a held message was redelivered to another consumer"
        time.sleep(0.1)
    assert slow.stats()["progress_sent"] >= 5
    slow.close()          # a holder that goes away without settling: the other gets them
    back: list = []
    consume(other, 5, back.extend, timeout=15)
    assert sorted(m for m, *_ in back) == sorted(m for m, *_ in held)
