"""The consumer cascade (stages/roles/consumer_stage.py) one role at a time, over fake
sockets: when a consumer finishes, whom it cancels, what it reports, and only once."""

from __future__ import annotations

from pathlib import Path

from offbroadway.stages.roles.batch_processor import BatchProcessorStage
from offbroadway.stages.roles.processor import ProcessorStage
from offbroadway.stages.runtime.spec import StageSpec
from offbroadway.stages.wire import commands, protocol
from offbroadway.stages.wire.events import encode_rows

from tests.stages.fakes import FakeIO, FakeSocket, subscribed_batcher

P = protocol
PRODUCERS = ("producer_0", "producer_1")


def reports(io: FakeIO) -> list[str]:
    """The names of what the stage reported to the daemon, but its periodic stats."""
    return [r[P.REPORT_NAME] for r in io.hub_sock.take() if r[P.REPORT_NAME] != "stats"]


def command(stage, io: FakeIO, record: commands.Command) -> None:
    io.hub_sock.push(record.encode())
    stage._on_hub(io.hub_sock)


def cancel(stage, sock: FakeSocket, reason: str = P.CANCEL_SHUTDOWN) -> None:
    sock.push(P.cancel(reason))
    stage._on_upstream(sock)


def processor(tmp_path: Path, batchers: tuple[str, ...] = ()) -> tuple[ProcessorStage, FakeIO]:
    spec = StageSpec("processor_default_0", "processor", "t", str(tmp_path),
                     handler="tests.stages.role_handlers:Upper", upstream=PRODUCERS,
                     producers=PRODUCERS, batchers=batchers, max_demand=10, min_demand=5)
    io = FakeIO()
    stage = ProcessorStage(spec, io)
    stage.setup()
    for p in PRODUCERS:
        io.dealers[p].take()
    return stage, io


def test_a_processor_without_batchers_reports_done_once_every_producer_cancelled(
        tmp_path: Path) -> None:
    stage, io = processor(tmp_path)
    cancel(stage, io.dealers["producer_0"])
    assert reports(io) == [] and not stage.finished
    cancel(stage, io.dealers["producer_1"])
    assert reports(io) == ["done"]
    # a late call finds it finished: nothing is said twice
    stage.maybe_finish()
    assert reports(io) == []
    stage.teardown()


def test_a_processor_with_batchers_cancels_them_and_reports_nothing(tmp_path: Path) -> None:
    stage, io = processor(tmp_path, batchers=("default",))
    router = io.router_sock
    router.push(b"batcher_default", P.subscribe(10, 5, "default", 1))
    stage.downstream._on_frames(router)
    router.take()
    for p in PRODUCERS:
        cancel(stage, io.dealers[p])
    sent = router.take()
    assert [(peer, f[P.KIND_AT], f[P.VALUE]) for peer, f in sent] == [
        (b"batcher_default", P.CANCEL, P.CANCEL_SHUTDOWN)]
    # its batcher's cancel is how the end goes on: the drain waits for no done of its
    assert reports(io) == []
    stage.teardown()


def test_a_leaving_processor_cancels_its_producers_and_reports_left_on_their_answers(
        tmp_path: Path) -> None:
    stage, io = processor(tmp_path)
    command(stage, io, commands.Leave())
    for p in PRODUCERS:
        (frame,) = io.dealers[p].take()
        assert frame[P.KIND_AT] == P.CANCEL and frame[P.VALUE] == P.CANCEL_LEAVING
    cancel(stage, io.dealers["producer_0"], P.CANCEL_LEAVING)
    assert reports(io) == []
    # a producer that restarted meanwhile has no answer to give: it is done too
    command(stage, io, commands.Resubscribe("producer_1"))
    assert reports(io) == ["left"]
    stage.teardown()


def test_in_the_drain_a_restarted_producer_counts_as_done(tmp_path: Path) -> None:
    stage, io = processor(tmp_path)
    command(stage, io, commands.NoResubscribe())
    cancel(stage, io.dealers["producer_0"])
    command(stage, io, commands.Resubscribe("producer_1"))
    assert not [f for f in io.dealers["producer_1"].take() if f[P.KIND_AT] == P.SUBSCRIBE]
    assert reports(io) == ["done"]
    stage.teardown()


def test_a_batcher_flushes_at_the_end_of_its_stream_then_cancels_its_batch_processors(
        tmp_path: Path) -> None:
    stage, router, up = subscribed_batcher(tmp_path, ask=1)
    router.take()
    up.push(P.events(encode_rows([(0, 1, "m1", "a", {})])))
    stage._on_upstream(up)
    cancel(stage, up)
    sent = [(f[P.KIND_AT], f[P.BATCH_TRIGGER] if f[P.KIND_AT] == P.BATCH else f[P.VALUE])
            for _, f in router.take()]
    assert sent == [(P.BATCH, "flush"), (P.CANCEL, P.CANCEL_SHUTDOWN)]
    assert reports(stage.io) == []


def test_a_batch_processor_reports_done_once_its_batcher_cancelled(tmp_path: Path) -> None:
    spec = StageSpec("batch_processor_default_0", "batch_processor", "t", str(tmp_path),
                     handler="tests.stages.role_handlers:Sizes", batcher="default",
                     upstream=("batcher_default",), producers=("producer_0",),
                     max_demand=4, min_demand=2)
    io = FakeIO()
    stage = BatchProcessorStage(spec, io)
    stage.setup()
    up = io.dealers["batcher_default"]
    cancel(stage, up)
    assert reports(io) == ["done"]
    # the daemon never tells a batch processor not to resubscribe: not a command for it
    command(stage, io, commands.NoResubscribe())
    cancel(stage, up)
    assert reports(io) == []
