"""The generator source: in-order synthetic messages, requeue, exhaustion, options."""

from __future__ import annotations

import time

import pytest
from offbroadway.stages.sources import SourceOptionError, get_source
from offbroadway.stages.sources.base import Source
from offbroadway.stages.wire import protocol

from .conftest import drain


def make(index: int = 0, producers: int = 2, **options: object) -> Source:
    src = get_source("generator")(options, pipeline="bench", producer_index=index,
                                  producer_count=producers, state_dir="")
    src.open()
    return src


def test_messages_in_order_with_ids_and_metadata() -> None:
    src = make(index=1, count=10, payload_bytes=7)
    assert src.fileno() is None
    items = src.fetch(4) + src.fetch(3)
    assert [i[0] for i in items] == [f"1-{n}" for n in range(7)]
    assert [i[1]["seq"] for i in items] == list(range(7))
    assert all(i[1]["payload"] == items[0][1]["payload"] for i in items)
    assert len(items[0][1]["payload"]) == 7
    assert all(i[2] == {"producer": 1} for i in items)
    # the metadata is encoded once for the frame; each message downstream owns its own
    frame = protocol.events(protocol.new_events(1, 100, items[:2]))
    a, b = protocol.to_messages(protocol.open_events(protocol.decode(frame)[3]))
    a.metadata["seen"] = True
    assert a.metadata is not b.metadata and b.metadata == {"producer": 1}


def test_count_is_per_producer_and_exhausts() -> None:
    src = make(count=25)
    assert not src.exhausted()
    items = drain(src, n=10)
    assert [i[1]["seq"] for i in items] == list(range(25))
    assert src.exhausted()
    assert src.fetch(10) == []
    src.ack([h for *_, h in items])
    stats = src.stats()
    assert stats["fetched"] == 25 and stats["acked"] == 25 and stats["unacked"] == 0


def test_requeue_re_emits_before_new_messages_in_seq_order() -> None:
    src = make(count=10)
    first = src.fetch(6)
    src.ack([first[0][3], first[1][3]])
    src.requeue([first[5][3], first[2][3]])      # handed back out of order
    again = src.fetch(3)
    assert [i[1]["seq"] for i in again] == [2, 5, 6]
    assert [i[0] for i in again] == ["0-2", "0-5", "0-6"]
    # 3 and 4 still out, 2 and 5 delivered again, 6 new: 5 owed; 7, 8, 9 not yet fetched
    assert src.stats()["unacked"] == 5


def test_requeue_keeps_source_unexhausted_until_refetched() -> None:
    src = make(count=3)
    items = drain(src)
    assert src.exhausted()
    src.requeue([h for *_, h in items])
    assert not src.exhausted()
    assert src.stats()["unacked"] == 3
    assert [i[1]["seq"] for i in drain(src)] == [0, 1, 2]
    assert src.exhausted()


def test_endless_without_count() -> None:
    src = make()
    for _ in range(50):
        assert len(src.fetch(1000)) == 1000
    assert not src.exhausted()
    assert src.stats()["next_seq"] == 50_000


def test_fail_settles_and_counts() -> None:
    src = make(count=4)
    items = drain(src)
    src.fail([(items[0][3], "bad"), (items[1][3], "worse")])
    src.ack([items[2][3], items[3][3]])
    s = src.stats()
    assert s["failed"] == 2 and s["acked"] == 2 and s["unacked"] == 0
    assert s["last_failure"] == "worse"


def test_default_payload_and_zero_count() -> None:
    assert len(make().fetch(1)[0][1]["payload"]) == 100
    src = make(count=0)
    assert src.fetch(5) == [] and src.exhausted()


@pytest.mark.parametrize("options, key", [
    ({"count": -1}, "count"), ({"count": "10"}, "count"), ({"count": True}, "count"),
    ({"payload_bytes": 1.5}, "payload_bytes"), ({"colour": "red"}, "colour"),
])
def test_bad_options_name_the_option(options: dict, key: str) -> None:
    with pytest.raises(SourceOptionError, match=repr(key)):
        make(**options)
    with pytest.raises(ValueError):
        get_source("generator").validate_options(options)


def test_fetch_is_fast() -> None:
    """The benchmark source must not be the bottleneck (loose bound: CI machines vary)."""
    src = make()
    start = time.perf_counter()
    for _ in range(200):
        src.fetch(1000)
    rate = 200_000 / (time.perf_counter() - start)
    assert rate > 200_000, f"{rate:.0f} msgs/s"
