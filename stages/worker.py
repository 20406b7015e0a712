"""Entry point of every stage process: ``python -m offbroadway.stages.worker``.

The stage's spec arrives in the environment (see :mod:`.spec`).  Imports are kept to the
stage runtime's own (zmq, msgpack), since restart latency is start-up time.
"""

from __future__ import annotations

import logging
import os
import sys

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
    logging.basicConfig(
        level=os.environ.get("OFFBROADWAY_LOG_LEVEL", "INFO").upper(),
        format=f"%(asctime)s %(levelname)s [{spec.id}] %(name)s: %(message)s",
        stream=sys.stderr)
    stage = _roles()[spec.role](spec)
    return stage.run()


if __name__ == "__main__":
    sys.exit(main())
