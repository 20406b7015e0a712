"""What each stage's own per-message work costs, in one process, against the lean pipeline's.

    .venv/bin/python bench/stage_costs.py [--events 1000] [--rounds 12]

The stages' functions on the frames they see in ``bench/throughput.py`` (1,000 generator
events of a 16-byte payload, the no-op handler that routes to a batcher): the producer's
fetch, events and encoding; the processor's opening of a frame, messages, blame record
and callbacks, events and encoding; the batcher's cut into packed events and batch frames;
the batch processor's opening, messages, ``handle_batch`` and ack.  Beside them, the same
steps as ``../shared/bench/lean_pipeline.py`` writes them (four flat fields per event, a
``Message`` per event, the data dict built in Python).  Each step runs in turn, round
after round, and the best round counts (the machine is shared: the best is the least
disturbed).  No sockets and no other process: what it leaves out (ZeroMQ, the loop,
demand, the processes competing for two cores) is what ``bench/throughput.py`` adds.
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
from collections.abc import Callable

import msgpack
from offbroadway import BatchInfo, Message, Pipeline
from offbroadway.stages.flow.inflight import InFlightTable
from offbroadway.stages.poison import blame
from offbroadway.stages.runtime import callbacks
from offbroadway.stages.sources.generator import GeneratorSource
from offbroadway.stages.wire import events as ev
from offbroadway.stages.wire import protocol
from offbroadway.stages.worker import GC_THRESHOLD


class Noop(Pipeline):
    def handle_message(self, processor, message, context):
        return message.put_batcher("sink")

    def handle_batch(self, batcher, messages, batch_info, context):
        return messages


def steps(n: int, record: blame.BlameRecorder) -> list[tuple[str, Callable[[], object]]]:
    h = Noop()
    src = GeneratorSource({"payload_bytes": 16}, pipeline="p", producer_index=0,
                          producer_count=1, state_dir=tempfile.gettempdir())
    items = src.fetch(n)
    events = protocol.new_events(0, time.time_ns(), items)
    packed = protocol.decode(protocol.events(events))[protocol.EVENTS_PACKED]
    opened = protocol.open_events(packed)

    def fetch_events() -> object:
        table: InFlightTable = InFlightTable()
        got = src.fetch(n)
        codec, ids, datas, metas, _ = ev.encode_items(got)
        rows = ev.new_rows(0, 1, ids, datas, metas)
        table.add_range(1, (item[3] for item in got))
        return protocol.events(rows, codec=codec)

    def process() -> object:
        messages = protocol.to_messages(opened, None, protocol.DEFAULT, protocol.DEFAULT)
        record.events(packed, messages)
        done, _, _ = callbacks.process(h, messages, None, {"sink"}, record, healthy=True)
        return protocol.message_events(done, protocol.DEFAULT)

    out = protocol.decode(process())[protocol.EVENTS_PACKED]
    raw = protocol.open_events(out).rows()

    def cut() -> object:
        block = protocol.open_events(out)
        rows = ev.transcode(block.rows(), block.codec)
        return [protocol.batch("default", "size", rows[i:i + 100])
                for i in range(0, len(rows), 100)]

    batches = [protocol.decode(protocol.batch("default", "size", raw[i:i + 100]))[
        protocol.BATCH_PACKED] for i in range(0, len(raw), 100)]

    def finish() -> object:
        for b in batches:
            messages = protocol.to_messages(protocol.open_events(b), None, "sink")
            rows = callbacks.handle_batch(h, "sink", messages,
                                          BatchInfo("sink", "default", len(messages), "size"),
                                          None)
            for tokens, fails in protocol.ack_groups(rows, ()).values():
                protocol.ack(tokens, fails)
        return None

    # the lean pipeline's steps, as it writes them
    lean_events = [(1 + i, f"0-{i}", i, "x" * 16) for i in range(n)]
    lean_frames = [msgpack.packb(lean_events[i:i + 100]) for i in range(0, n, 100)]

    def lean_process() -> object:
        outs = []
        for f in lean_frames:
            evs = msgpack.unpackb(f)
            msgs = [Message(e[1], {"seq": e[2], "payload": e[3]}, None) for e in evs]
            done = []
            for e, m in zip(evs, msgs):
                r = h.handle_message("default", m, None)
                if r.status is None:
                    done.append((e[0], r.id, r.data["seq"], r.data["payload"], r.batcher))
            outs.append(msgpack.packb(done))
        return outs

    lean_out = lean_process()

    def lean_finish() -> object:
        for f in lean_out:
            evs = msgpack.unpackb(f)
            msgs = [Message(e[1], {"seq": e[2], "payload": e[3]}, None, batcher=e[4])
                    for e in evs]
            h.handle_batch("b", msgs, BatchInfo("b", "default", len(msgs), "size"), None)
            # the token beside the message (the handler returns its messages, in order)
            msgpack.packb([e[0] for e, m in zip(evs, msgs) if m.status is None])
        return None

    def lean_produce() -> object:
        inflight: dict[int, int] = {}
        frames = []
        for b in range(0, n, 100):
            frames.append(msgpack.packb([(1 + i, f"0-{i}", i, "x" * 16)
                                         for i in range(b, b + 100)]))
            inflight.update((1 + i, i) for i in range(b, b + 100))
        return frames

    return [("producer: fetch, events, in-flight, encode", fetch_events),
            ("processor: open a frame's events", lambda: protocol.open_events(packed)),
            ("processor: messages, blame, callbacks, encode", process),
            ("batcher: cut into batch frames", cut),
            ("batch processor: open, messages, handle_batch, ack", finish),
            ("lean producer (events, in-flight, encode)", lean_produce),
            ("lean processor (open to encode)", lean_process),
            ("lean batcher", lambda: [msgpack.packb(msgpack.unpackb(f)) for f in lean_out]),
            ("lean batch processor", lean_finish)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 20, 10)     # as in a stage process
    with tempfile.TemporaryDirectory() as tmp:
        record = blame.BlameRecorder(os.path.join(tmp, "p.blame"))
        todo = steps(args.events, record)
        best: dict[str, float] = {}
        for _ in range(args.rounds):
            for name, fn in todo:
                t0 = time.perf_counter()
                for _ in range(10):
                    fn()
                us = (time.perf_counter() - t0) / 10 / args.events * 1e6
                best[name] = min(best.get(name, us), us)
        record.close()
    print(f"load {os.getloadavg()}; µs per message, best of {args.rounds} rounds")
    for name, _ in todo:
        print(f"  {name:52s} {best[name]:6.3f}")


if __name__ == "__main__":
    main()
