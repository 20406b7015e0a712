"""The four data roles built and driven without sockets: each is handed fake sockets
(tests/stages/fakes.py), fed frames as its peers would send them, and judged by the frames
it sends back.  What the end-to-end tests show through a whole pipeline is shown here one
role and one rule at a time, in milliseconds."""

from __future__ import annotations

from pathlib import Path

import pytest
from offbroadway.stages.roles.batch_processor import BatchProcessorStage
from offbroadway.stages.roles.batcher import BatcherStage
from offbroadway.stages.roles.processor import ProcessorStage
from offbroadway.stages.roles.producer import ProducerStage
from offbroadway.stages.runtime.spec import StageSpec
from offbroadway.stages.sources.base import FailedItem
from offbroadway.stages.wire import commands, protocol
from offbroadway.stages.wire.events import encode_rows

from tests.stages import role_handlers
from tests.stages.fakes import FakeIO, subscribed_batcher

P = protocol


def events(*data: str, first_token: int = 1) -> list[tuple]:
    """Event rows as a producer makes them: each message's data and metadata encoded."""
    return encode_rows([(0, first_token + i, f"m{first_token + i}", d, {})
                        for i, d in enumerate(data)])


def kinds(frames: list) -> list[int]:
    return [f[1][P.KIND_AT] if isinstance(f[0], bytes) else f[P.KIND_AT] for f in frames]


def test_a_role_is_built_with_no_socket_of_its_own(tmp_path: Path) -> None:
    spec = StageSpec("batcher_default", "batcher", "t", str(tmp_path), batcher="default",
                     upstream=("processor_default_0",), consumer_count=1)
    io = FakeIO()
    stage = BatcherStage(spec, io)
    # the hub is the one socket a stage has before setup, and it is the fake's
    assert stage.hub is io.hub_sock and not io.dealers and io.router_sock is None


def test_producer_sends_on_demand_and_acks_settle_the_source(tmp_path: Path) -> None:
    spec = StageSpec("producer_0", "producer", "t", str(tmp_path), source="generator",
                     source_options={"count": 10}, consumer_count=1)
    io = FakeIO()
    stage = ProducerStage(spec, io)
    stage.setup()
    router = io.router_sock
    router.push(b"processor_default_0", P.subscribe(10, 5, None, 1))
    router.push(b"processor_default_0", P.ask(4))
    stage.downstream._on_frames(router)
    sent = router.take()
    assert kinds(sent) == [P.SUBSCRIBED, P.EVENTS]
    evs = P.open_events(sent[1][1][P.EVENTS_PACKED])
    assert len(evs) == 4 and stage.counters["out"] == 4 and len(stage.inflight) == 4
    # one ok, one failed: both settle, the source is told each way
    ok, bad = P.event_token(evs[0]), P.event_token(evs[1])
    router.push(b"processor_default_0", P.ack([ok], [[bad, "nope"]]))
    stage.downstream._on_frames(router)
    assert stage.counters["acked"] == 1 and stage.counters["failed"] == 1
    assert len(stage.inflight) == 2
    # a stage downstream died: what is in flight goes back to the source
    stage._on_requeue(commands.Requeue("processor_default_0 died", None, False))
    assert len(stage.inflight) == 0 and stage.counters["requeued"] == 2


def test_producer_fails_what_its_source_hands_over_failed(tmp_path: Path) -> None:
    """A source's failure travels beside the message (FailedItem), leaving its metadata
    alone; a source that still says it in ``metadata["error"]`` is understood the same."""
    spec = StageSpec("producer_0", "producer", "t", str(tmp_path), source="generator",
                     source_options={"count": 10}, consumer_count=1)
    stage = ProducerStage(spec, FakeIO())
    stage.setup()
    first = stage.next_token
    evs, codec = stage._to_events([("ok", 1, {"k": 1}, "h1"),
                                   FailedItem("new", b"raw", {"k": 2}, "h2", "not JSON"),
                                   ("old", None, {"error": "too big"}, "h3")])
    assert [P.event_to_message(ev, None, codec).metadata for ev in evs] == [
        {"k": 1}, {"k": 2}, {"error": "too big"}]
    assert stage._failed == {first + 1: "not JSON", first + 2: "too big"}


def test_a_restarted_producer_counts_a_poison_messages_crashes_on(tmp_path: Path) -> None:
    """Under ``--until-idle`` a crash during the drain restarts the producers to run again,
    and a poison message in flight when a drain begins crashes in each drain.  A new
    producer that counted from zero never reached ``max_crashes``: run again after run
    again, until the restart intensity ended the daemon (exit 1, the poison unacked).  The
    count carries over (the books in the runtime dir); the producer answers each requeue
    with ``Idle(False)`` (the daemon takes no idle report of its from before it)."""
    from offbroadway.stages.poison import books
    from offbroadway.stages.wire.commands import Blame, Suspect

    spec = StageSpec("producer_0", "producer", "t", str(tmp_path), source="generator",
                     source_options={"count": 1}, consumer_count=1, max_crashes=2)

    def incarnation() -> tuple[ProducerStage, FakeIO]:
        io = FakeIO()
        stage = ProducerStage(spec, io)
        stage.setup()
        return stage, io

    def crash_running_it(stage: ProducerStage) -> str:
        [ev], _ = stage._to_events(stage.source.fetch(1))
        blame = Blame("handle_message", (Suspect(0, P.event_token(ev), P.event_id(ev)),), 1,
                      "processor_default_0", "killed by SIGSEGV")
        stage._on_requeue(commands.Requeue("processor_default_0 down", blame, False))
        return P.event_id(ev)

    first, io = incarnation()
    poison = crash_running_it(first)
    assert first.poison.strikes.crashes(poison) == 1
    reports = [P.decode(f) for f in io.hub_sock.sent]
    assert [r[1:] for r in reports if r[1] == "idle"][-1] == ["idle", {"idle": False}]

    second, _ = incarnation()                       # the run again's producer
    assert second.poison.strikes.crashes(poison) == 1
    assert crash_running_it(second) == poison
    assert second.poison.strikes.crashes(poison) == 2

    third, _ = incarnation()
    [ev], _ = third._to_events(third.source.fetch(1))
    why = third._failed[P.event_token(ev)]
    assert why.startswith("poison message: killed a processor 2 times (last: "
                          "processor_default_0 killed by SIGSEGV)")
    third._settle([], [[P.event_token(ev), why]])   # dead-lettered: the books close
    assert third.poison.failed == 1 and len(third.poison) == 0
    assert not Path(books.path(str(tmp_path), "producer_0")).exists()
    fourth, _ = incarnation()
    assert len(fourth.poison) == 0


def test_processor_runs_the_handler_and_acks_each_message_to_its_producer(
        tmp_path: Path) -> None:
    spec = StageSpec("processor_default_0", "processor", "t", str(tmp_path),
                     handler="tests.stages.role_handlers:Upper", upstream=("producer_0",),
                     producers=("producer_0",), max_demand=10, min_demand=5)
    io = FakeIO()
    stage = ProcessorStage(spec, io)
    stage.setup()
    up = io.dealers["producer_0"]
    assert kinds(up.take()) == [P.SUBSCRIBE]        # no ask before SUBSCRIBED fences
    # a producer running GenStage's plain demand dispatcher (with "spread" the budget may
    # give back events it would not start soon: shedding, tested in test_demand.py)
    up.push(P.subscribed("demand", 1))
    stage._on_upstream(up)
    asked = up.take()
    assert kinds(asked) == [P.ASK] and asked[0][P.VALUE] == 10
    up.push(P.events(events("a", "bad", "c")))
    stage._on_upstream(up)
    acks = [f for f in up.take() if f[P.KIND_AT] == P.ACK]
    assert len(acks) == 1
    assert P.acked_tokens(acks[0][P.ACK_OK]) == [1, 3]
    assert acks[0][P.ACK_FAILED] == [[2, "bad data"]]
    stage.teardown()


def test_batcher_groups_by_size_and_flushes_the_rest_on_demand(tmp_path: Path) -> None:
    stage, router, up = subscribed_batcher(tmp_path, ask=2)
    up.push(P.events(events("a", "b", "c", "d", "e", "f", "g")))
    stage._on_upstream(up)
    batches = [f[1] for f in router.take() if f[1][P.KIND_AT] == P.BATCH]
    assert [(b[P.BATCH_TRIGGER], P.open_events(b[P.BATCH_PACKED]).ids)
            for b in batches] == [("size", ["m1", "m2", "m3"]), ("size", ["m4", "m5", "m6"])]
    # the seventh waits: a flush emits it, and it goes when the batch processor asks
    stage._on_flush(commands.Flush())
    assert not [f for f in router.take() if f[1][P.KIND_AT] == P.BATCH]
    router.push(b"batch_processor_default_0", P.ask(1))
    stage.downstream._on_frames(router)
    (last,) = [f[1] for f in router.take() if f[1][P.KIND_AT] == P.BATCH]
    assert last[P.BATCH_TRIGGER] == "flush" and len(P.open_events(last[P.BATCH_PACKED])) == 1


@pytest.fixture()
def seen() -> list:
    role_handlers.Sizes.seen = []
    return role_handlers.Sizes.seen


def test_batch_processor_handles_a_batch_and_acks_it_to_the_producer(
        tmp_path: Path, seen: list) -> None:
    spec = StageSpec("batch_processor_default_0", "batch_processor", "t", str(tmp_path),
                     handler="tests.stages.role_handlers:Sizes", batcher="default",
                     upstream=("batcher_default",), producers=("producer_0",),
                     max_demand=4, min_demand=2)
    io = FakeIO()
    stage = BatchProcessorStage(spec, io)
    stage.setup()
    up, producer = io.dealers["batcher_default"], io.dealers["producer_0"]
    assert kinds(up.take())[0] == P.SUBSCRIBE
    up.push(P.batch("default", "size", events("x", "bad", "y")))
    stage._on_upstream(up)
    assert seen == [("default", "size", 3)]
    (ack,) = producer.take()
    assert P.acked_tokens(ack[P.ACK_OK]) == [1, 3] and ack[P.ACK_FAILED] == [[2, "bad row"]]
    assert stage.counters["batches"] == 1
