"""Cost of the poison blame record on the processor's hot path.

Runs :func:`offbroadway.stages.runtime.callbacks.process` on frames of messages with a trivial
handler, with and without a :class:`~offbroadway.stages.poison.blame.BlameRecorder`, and prints
the time per message of each and the difference.  Pure CPU, no processes or sockets:
what the record adds per message, not what the pipeline does around it.

    .venv/bin/python bench/blame.py [--frames 20000] [--frame-size 10] [--repeat 5]
"""

from __future__ import annotations

import argparse
import tempfile
import time

from offbroadway import Message, Pipeline
from offbroadway.stages.poison import blame
from offbroadway.stages.runtime import callbacks
from offbroadway.stages.wire import events as ev
from offbroadway.stages.wire import protocol


class Passthrough(Pipeline):
    def handle_message(self, processor: str, message: Message, context) -> Message:
        return message


def run(frames: int, size: int, recorder: blame.BlameRecorder | None,
        packed: bool = False) -> float:
    """Seconds per message; ``packed``: the frame's packed events go into the record once
    per frame (what the processor does since issue 12), then a position per message."""
    handler = Passthrough()
    evs = [[0, 1_763_000_000 + i, f"part-{i:03d}.jsonl:{i}", {"seq": i}, {}]
           for i in range(size)]
    raw = protocol.decode(protocol.events(ev.encode_rows(evs)))[3]
    batch = protocol.to_messages(protocol.open_events(raw))
    started = time.perf_counter()
    for _ in range(frames):
        if packed and recorder is not None:
            recorder.events(raw, batch)
        callbacks.process(handler, batch, None, frozenset(), recorder)
    return (time.perf_counter() - started) / (frames * size)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=20_000)
    ap.add_argument("--frame-size", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        rec = blame.BlameRecorder(blame.path(d, "processor_default_0"))
        plain, blamed, framed = [], [], []
        for _ in range(args.repeat):      # interleaved, so load noise hits all alike
            plain.append(run(args.frames, args.frame_size, None))
            blamed.append(run(args.frames, args.frame_size, rec))
            framed.append(run(args.frames, args.frame_size, rec, packed=True))
        rec.close()
    p, b, f = min(plain), min(blamed), min(framed)
    print(f"frames of {args.frame_size}, best of {args.repeat} x {args.frames} frames")
    print(f"process() without blame: {p * 1e9:7.0f} ns/message")
    print(f"process() with blame:    {b * 1e9:7.0f} ns/message")
    print(f"blame record:            {(b - p) * 1e9:7.0f} ns/message")
    print(f"with the packed frame:   {(f - p) * 1e9:7.0f} ns/message (frame copied once, "
          f"then a position per message)")


if __name__ == "__main__":
    main()
