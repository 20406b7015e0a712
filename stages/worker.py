"""Entry point of every stage process: ``python -m offbroadway.stages.worker``.

The stage's spec arrives in the environment (see :mod:`.runtime.spec`).  Imports are kept
to the stage runtime's own (zmq, msgpack), since restart latency is start-up time.

It stands above the folders it ties together (``runtime/``, ``roles/``, ``sources/``) so
that none of them imports it back: the roles and the sources build on the runtime, and
only this module knows every role.
"""

from __future__ import annotations

import gc
import logging
import os
import sys

import msgspec
from offbroadway.supervision.child import guard_descendants, kill_descendants

from .runtime import logs
from .runtime.liveness import Liveness
from .runtime.redact import install_filter, value_secrets
from .runtime.spec import StageSpec
from .sources.base import EXIT_SOURCE_REFUSED, SourceError


def _role(role: str) -> type:
    """The stage class of ``role``, importing only its module: the committer's pyarrow
    (and numpy) would add ~30 MB to every stage process that imported it for nothing."""
    if role == "committer":
        from .roles.committer import CommitterStage

        return CommitterStage
    from .roles.batch_processor import BatchProcessorStage
    from .roles.batcher import BatcherStage
    from .roles.processor import ProcessorStage
    from .roles.producer import ProducerStage

    roles: dict[str, type] = {"producer": ProducerStage, "processor": ProcessorStage,
                              "batcher": BatcherStage, "batch_processor": BatchProcessorStage}
    return roles[role]


#: allocations (net of frees) between young-generation collections in a stage process
GC_THRESHOLD = 50_000


def main() -> int:
    # before any user code can start a process: its processes die with the daemon
    guard_descendants()
    spec = StageSpec.from_env()
    logs.configure(os.environ.get(logs.LEVEL_ENV, "info"),
                   os.environ.get(logs.FORMAT_ENV, "text"), spec.id)
    # the source's secrets never reach a log line, whoever quotes them
    install_filter(value_secrets({"options": spec.source_options, "context": spec.context,
                                  "spark": msgspec.to_builtins(spec.spark)}))
    stage = _role(spec.role)(spec)
    # a long callback is not a hung process: this thread beats while one runs
    Liveness(spec.id, spec.message_timeout).start()
    # Everything imported and built so far lives as long as the process: keep it out of
    # the collector's generations, which otherwise rescan it on the hot path.
    gc.freeze()
    # A frame of a thousand events allocates thousands of containers (messages, their
    # data dicts) that die with the frame; at the default threshold (700) the collector
    # runs several times per frame for nothing (about 20% of a processor's CPU, measured
    # by bench/throughput.py).  Cycles are still collected, a little later.
    gc.set_threshold(GC_THRESHOLD, 20, 10)
    try:
        return stage.run()
    except SourceError as exc:
        # the server refused the source as configured: one line, the server's words, no
        # traceback; the daemon's supervisor sees the exit code
        logging.getLogger("offbroadway.sources").error("%s", exc)
        return EXIT_SOURCE_REFUSED
    finally:
        # what the handler started goes with the stage (the daemon kills our process
        # group when we exit; this reaches the ones that left it)
        kill_descendants()


if __name__ == "__main__":
    sys.exit(main())
