"""The library's default restart intensity is OTP's (1 restart in 5 s: a second crash
within the period escalates), while the pipeline's specs keep Broadway's values
explicitly, none of them left to the library's default."""

from __future__ import annotations

import asyncio
import os
import signal

from offbroadway.daemon.config.load import validate
from offbroadway.daemon.spark.wiring import Wiring
from offbroadway.supervision import Strategy, Supervisor, SupervisorSpec
from offbroadway.supervision.tree import walk

from tests.supervision.conftest import worker


def test_the_default_intensity_is_otps() -> None:
    spec = SupervisorSpec("s", Strategy.ONE_FOR_ONE, [])
    assert (spec.max_restarts, spec.max_seconds) == (1, 5.0)


def test_a_second_crash_within_five_seconds_gives_up_under_the_default(log) -> None:
    async def scenario() -> str:
        sup = Supervisor(SupervisorSpec("root", Strategy.ONE_FOR_ONE, [worker("w", log)]))
        await sup.start()
        try:
            for _ in range(2):
                pid = sup.find("w").pid
                os.kill(pid, signal.SIGKILL)
                for _ in range(200):
                    if sup.state == "failed" or (sup.find("w").pid not in (None, pid)):
                        break
                    await asyncio.sleep(0.02)
            return await asyncio.wait_for(sup.wait_failed(), 10)
        finally:
            await sup.stop()

    assert "more than 1 restarts in 5s" in asyncio.run(scenario())


def test_the_pipelines_supervisors_say_their_intensity() -> None:
    config = validate({
        "pipeline": {"name": "t", "handler": "examples.orders:Orders"},
        "producer": {"source": "spool", "options": {"path": "var/spool"}},
        "batchers": {"b": {"batch_size": 10}},
        "runtime": {"dir": "/tmp/ob-run"},
    }).config
    root = Wiring(config).build(config).root
    sups = {s.id: (s.max_restarts, s.max_seconds) for s in walk(root)
            if isinstance(s, SupervisorSpec)}
    assert sups["BatchersSupervisor"] == (3, 5.0)
    assert sups["BatcherSupervisor_b"] == (3, 5.0)
    assert sups["ProcessorSupervisor"][0] == 0 and sups["BatchProcessorSupervisor_b"][0] == 0
    assert sups["ProducerSupervisor"] == (config.producer.max_restarts,
                                          config.producer.max_seconds)
