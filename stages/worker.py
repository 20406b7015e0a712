"""Entry point of every stage process: ``python -m offbroadway.stages.worker``.

The stage's spec arrives in the environment (see :mod:`.spec`).  Imports are kept to the
stage runtime's own (zmq, msgpack), since restart latency is start-up time.
"""

from __future__ import annotations

import gc
import os
import sys

from . import logs
from .spec import StageSpec


def _roles() -> dict:
    from .batch_processor import BatchProcessorStage
    from .batcher import BatcherStage
    from .processor import ProcessorStage
    from .producer import ProducerStage

    return {"producer": ProducerStage, "processor": ProcessorStage, "batcher": BatcherStage,
            "batch_processor": BatchProcessorStage}


def main() -> int:
    spec = StageSpec.from_env()
    logs.configure(os.environ.get(logs.LEVEL_ENV, "info"),
                   os.environ.get(logs.FORMAT_ENV, "text"), spec.id)
    stage = _roles()[spec.role](spec)
    # Everything imported and built so far lives as long as the process: keep it out of
    # the collector's generations, which otherwise rescan it on the hot path.
    gc.freeze()
    return stage.run()


if __name__ == "__main__":
    sys.exit(main())
