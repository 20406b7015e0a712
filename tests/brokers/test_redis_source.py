"""The redis (Streams) source in-process against the real Redis: every entry acked exactly
once, dead letters, requeue, reclaiming a dead consumer's entries (and never a live one's),
killed connections, two consumers in one group."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
from offbroadway.stages.sources.redis_streams import RedisStreamsSource

from tests.brokers.conftest import REDIS_URL, TcpProxy, consume, consume_until, unique
from tests.conftest import wait_until

pytestmark = pytest.mark.broker


def stream(rq: Any, n: int = 0) -> tuple[str, list[str]]:
    """A fresh stream (deleted at teardown) with n entries ``{"seq": i, "body": …}``."""
    name = unique("s")
    rq.test_streams.append(name)
    pipe = rq.pipeline(transaction=False)
    for i in range(n):
        pipe.xadd(name, {"seq": str(i), "body": f"payload {i}"})
    ids = [i.decode() for i in pipe.execute()] if n else []
    return name, ids


def make(name: str, sources: Any, *, group: str = "g", consumer: str | None = None,
         state_dir: str = "", **options: Any) -> Any:
    opts: dict[str, Any] = {"url": REDIS_URL, "stream": name, "group": group, **options}
    if consumer:
        opts["consumer"] = consumer
    src = RedisStreamsSource(opts, pipeline="p", producer_index=0, producer_count=1,
                             state_dir=state_dir)
    sources(src)
    src.open()
    return src


def ack_all(src: Any, seen: Counter | None = None) -> Any:
    def on_items(items: list) -> None:
        if seen is not None:
            seen.update(msg_id for msg_id, *_ in items)
        src.ack([h for *_, h in items])
    return on_items


def group_info(rq: Any, name: str, group: str = "g") -> dict:
    return next(g for g in rq.xinfo_groups(name) if g["name"].decode() == group)


# -- options ------------------------------------------------------------------------------
def test_options_and_consumer_names() -> None:
    for bad, key in [({}, "stream"), ({"stream": "s", "on_failure": "drop"}, "on_failure"),
                     ({"stream": "s", "claim_idle_ms": -1}, "claim_idle_ms"),
                     ({"stream": "s", "url": "amqp://x"}, "url"),
                     ({"stream": "s", "block": 5}, "block")]:
        with pytest.raises(ValueError, match=key):
            RedisStreamsSource.validate_options(bad)

    def name(state_dir: str, index: int = 0) -> str:
        return RedisStreamsSource({"stream": "s"}, pipeline="orders", producer_index=index,
                                  producer_count=2, state_dir=state_dir).consumer

    # stable across restarts of one daemon, distinct between daemons and producers
    assert name("/var/lib/a") == name("/var/lib/a")
    assert len({name("/var/lib/a"), name("/var/lib/b"), name("/var/lib/a", 1)}) == 3
    src = RedisStreamsSource({"stream": "s"}, pipeline="orders")
    assert src.group == "orders" and src.dead_letter_stream == "s:dead"


# -- the 10,000 entry run -------------------------------------------------------------------
def test_ten_thousand_fetched_and_acked_once(rq: Any, sources: Any) -> None:
    name, ids = stream(rq, 10_000)
    src = make(name, sources)
    seen: Counter = Counter()

    def on_items(items: list) -> None:
        for msg_id, data, meta, _h in items:
            assert data == {"seq": data["seq"], "body": f"payload {data['seq']}"}
            assert meta["id"] == msg_id and meta["delivery"] == "new"
        ack_all(src, seen)(items)

    consume(src, 10_000, on_items, batch=250)
    assert set(seen) == set(ids) and max(seen.values()) == 1
    assert src.exhausted()
    assert src.stats()["acked"] == 10_000 and src.stats()["unacked"] == 0
    info = group_info(rq, name)
    assert info["pending"] == 0 and info["lag"] == 0
    # a fresh consumer of the group gets nothing
    assert rq.xreadgroup("g", "fresh", {name: ">"}, count=10) == []
    rq.xadd(name, {"seq": "late"})
    assert not src.exhausted()


def test_binary_values_stay_bytes(rq: Any, sources: Any) -> None:
    name, _ = stream(rq)
    rq.xadd(name, {"text": "héllo", b"raw": b"\xff\x00"})
    src = make(name, sources)
    (_msg_id, data, _meta, h), = src.fetch(10)
    assert data == {"text": "héllo", "raw": b"\xff\x00"}
    src.ack([h])


# -- failure policies -----------------------------------------------------------------------
def test_dead_letter_gets_exactly_the_failures(rq: Any, sources: Any) -> None:
    name, ids = stream(rq, 200)
    failing = set(ids[::7])
    src = make(name, sources)

    def on_items(items: list) -> None:
        src.ack([h for m, *_, h in items if m not in failing])
        src.fail([(h, f"bad {m}") for m, *_, h in items if m in failing])

    consume(src, 200, on_items, batch=30)
    dead = rq.xrange(f"{name}:dead")
    assert sorted(f[b"dead_letter.id"].decode() for _, f in dead) == sorted(failing)
    one = dead[0][1]
    assert one[b"dead_letter.reason"] == b"bad " + one[b"dead_letter.id"]
    assert one[b"body"] == b"payload " + one[b"seq"]          # the original fields, verbatim
    assert group_info(rq, name)["pending"] == 0
    assert src.stats()["dead_lettered"] == len(failing) and src.exhausted()


def test_leave_pending_retries_after_claim_idle(rq: Any, sources: Any) -> None:
    name, _ids = stream(rq, 20)
    src = make(name, sources, on_failure="leave_pending", claim_idle_ms=200)
    first: list = []
    consume(src, 20, first.extend)
    failing = {m for m, *_ in first[:5]}
    src.fail([(h, "later") for m, *_, h in first if m in failing])
    src.ack([h for m, *_, h in first if m not in failing])
    assert group_info(rq, name)["pending"] == 5
    retried: list = []

    def on_items(items: list) -> None:
        retried.extend(items)
        ack_all(src)(items)

    consume_until(src, lambda: len(retried) >= 5, on_items, timeout=20)
    assert {m for m, *_ in retried} == failing
    assert all(meta["delivery"] == "claimed" for _m, _d, meta, _h in retried)
    assert group_info(rq, name)["pending"] == 0


def test_requeue_rereads_own_pending_first(rq: Any, sources: Any) -> None:
    name, ids = stream(rq, 30)
    src = make(name, sources)
    first = src.fetch(10)
    src.requeue([h for *_, h in first])
    assert src.stats()["requeued"] == 10
    again = src.fetch(10)
    assert [m for m, *_ in again] == [m for m, *_ in first]
    assert all(meta["delivery"] == "pending" and meta["redelivered"]
               for _m, _d, meta, _h in again)
    seen: Counter = Counter(m for m, *_ in again)
    src.ack([h for *_, h in again])
    consume(src, 20, ack_all(src, seen))
    assert set(seen) == set(ids) and group_info(rq, name)["pending"] == 0


# -- crashes and reclaiming -----------------------------------------------------------------
def test_restarted_consumer_rereads_what_it_held(rq: Any, sources: Any) -> None:
    name, ids = stream(rq, 50)
    first = make(name, sources, state_dir="/tmp/daemon-a")
    held = first.fetch(20)
    first.close()                                   # "crashed": nothing acked
    second = make(name, sources, state_dir="/tmp/daemon-a")
    assert second.consumer == first.consumer
    again = second.fetch(20)
    assert [m for m, *_ in again] == [m for m, *_ in held]
    assert {meta["delivery"] for _m, _d, meta, _h in again} == {"pending"}
    seen: Counter = Counter(m for m, *_ in again)
    second.ack([h for *_, h in again])
    consume(second, 30, ack_all(second, seen))
    assert set(seen) == set(ids) and group_info(rq, name)["pending"] == 0


def test_dead_consumers_entries_are_claimed(rq: Any, sources: Any) -> None:
    name, ids = stream(rq, 100)
    dead = make(name, sources, consumer="dead", claim_idle_ms=300)
    held = {m for m, *_ in dead.fetch(40)}          # then it dies: no ack, no more calls
    alive = make(name, sources, consumer="alive", claim_idle_ms=300)
    seen: Counter = Counter()
    claimed: set = set()

    def on_items(items: list) -> None:
        claimed.update(m for m, _d, meta, _h in items if meta["delivery"] == "claimed")
        ack_all(alive, seen)(items)

    consume_until(alive, lambda: set(seen) == set(ids) - held | held, on_items, timeout=30)
    assert claimed == held and max(seen.values()) == 1
    assert group_info(rq, name)["pending"] == 0
    assert alive.stats()["claimed"] == 40


def test_live_consumers_slow_entries_are_not_claimed(rq: Any, sources: Any) -> None:
    name, _ids = stream(rq, 100)
    slow = make(name, sources, consumer="slow", claim_idle_ms=500)
    held = slow.fetch(40)                           # "processing" for > 3 x claim_idle_ms
    other = make(name, sources, consumer="other", claim_idle_ms=500)
    got: Counter = Counter()
    end = time.monotonic() + 1.6
    while time.monotonic() < end:                    # the condition is time passing itself
        slow.exhausted()                             # the producer calls it every 0.2 s
        items = other.fetch(10)
        got.update(m for m, *_ in items)
        other.ack([h for *_, h in items])
        time.sleep(0.05)
    assert not set(got) & {m for m, *_ in held}      # nothing taken from the live consumer
    assert len(got) == 60 and other.stats()["claimed"] == 0
    slow.ack([h for *_, h in held])
    assert group_info(rq, name)["pending"] == 0


def test_killed_connections_reconnect_and_lose_nothing(rq: Any, sources: Any) -> None:
    name, ids = stream(rq, 3000)
    consumer = unique("kill")
    src = make(name, sources, consumer=consumer, backoff_min=0.01, backoff_max=0.2)
    seen: Counter = Counter()

    def kill() -> int:
        return sum(rq.client_kill_filter(_id=c["id"]) for c in rq.client_list()
                   if c.get("name") == consumer)

    consume(src, 500, ack_all(src, seen))
    assert kill() >= 1                  # between two commands: redis-py reconnects quietly
    consume(src, 500, ack_all(src, seen))
    assert kill() >= 1
    consume_until(src, lambda: set(seen) == set(ids) and src.exhausted(),
                  ack_all(src, seen), timeout=30)
    assert max(seen.values()) == 1 and src.stats()["acked"] == 3000
    assert group_info(rq, name)["pending"] == 0


def test_blocked_read_killed_mid_command(rq: Any, sources: Any) -> None:
    name, _ = stream(rq)
    consumer = unique("blocked")
    src = make(name, sources, consumer=consumer, block_ms=5000, backoff_min=0.01)

    def kill_when_blocked() -> None:
        def blocked() -> list:
            return [c for c in rq.client_list()
                    if c.get("name") == consumer and c.get("cmd") == "xreadgroup"
                    and "b" in c.get("flags", "")]
        for c in wait_until(blocked, timeout=10, message="XREADGROUP blocking"):
            rq.client_kill_filter(_id=c["id"])

    killer = threading.Thread(target=kill_when_blocked)
    killer.start()
    assert src.fetch(10) == []                      # the reply never comes: an error
    killer.join()
    assert src.stats()["errors"] == 1 and src.stats()["state"] == "disconnected"
    entry = rq.xadd(name, {"k": "v"}).decode()
    got: list = []
    # (not consume_until: a second fetch would block block_ms on the empty stream)
    wait_until(lambda: got.extend(src.fetch(10)) or got, timeout=20, message="the entry")
    assert [m for m, *_ in got] == [entry] and src.stats()["reconnects"] == 1
    src.ack([h for *_, h in got])
    assert group_info(rq, name)["pending"] == 0


def test_server_unreachable_then_back(rq: Any, sources: Any) -> None:
    """Redis "restarts" (a proxy drops every connection and refuses new ones): acks that
    cannot be sent are kept, the source backs off without blocking, then finishes."""
    name, ids = stream(rq, 1000)
    proxy = TcpProxy(6379)
    try:
        src = make(name, sources, url=f"redis://127.0.0.1:{proxy.port}/0",
                   backoff_min=0.01, backoff_max=0.1)
        seen: Counter = Counter()
        consume(src, 300, ack_all(src, seen))
        held = src.fetch(100)
        proxy.down()
        ack_all(src, seen)(held)                      # cannot be sent: kept
        stats = src.stats()
        assert stats["unsent_acks"] == 100 and stats["state"] == "disconnected"
        t0 = time.monotonic()
        assert src.fetch(10) == [] and src.exhausted() is False
        assert time.monotonic() - t0 < 1.0            # the producer's loop is not blocked
        assert 0 <= src.retry_after() <= 0.2
        proxy.up()
        consume_until(src, lambda: set(seen) == set(ids) and src.exhausted(),
                      ack_all(src, seen), timeout=30)
        stats = src.stats()
        assert stats["reconnects"] >= 1 and stats["unsent_acks"] == 0
        assert max(seen.values()) == 1 and stats["acked"] == 1000
        assert group_info(rq, name)["pending"] == 0
    finally:
        proxy.down()


# -- horizontal scale -----------------------------------------------------------------------
def test_two_consumers_in_one_group_split_the_work(rq: Any, sources: Any) -> None:
    name, ids = stream(rq, 2000)
    a = make(name, sources, state_dir="/tmp/daemon-a")
    b = make(name, sources, state_dir="/tmp/daemon-b")
    assert a.consumer != b.consumer
    got: dict[str, Counter] = {"a": Counter(), "b": Counter()}

    def total() -> int:
        for key, src in (("a", a), ("b", b)):
            items = src.fetch(25)
            got[key].update(m for m, *_ in items)
            src.ack([h for *_, h in items])
        return sum(sum(c.values()) for c in got.values())

    wait_until(lambda: total() >= 2000, timeout=60, interval=0,
               message="2000 entries between the two")
    assert not set(got["a"]) & set(got["b"])
    assert set(got["a"]) | set(got["b"]) == set(ids)
    assert len(got["a"]) == len(got["b"]) == 1000
    assert group_info(rq, name)["pending"] == 0
