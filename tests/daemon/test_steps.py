"""The daemon's start and stop order (daemon/shell/steps.py): each step after what it
requires, the stop in reverse, and only what started is stopped.  The order is what keeps
a stop from closing the hub under stages that still report, or removing the rate limit
under producers that still map it."""

from __future__ import annotations

import asyncio

import pytest
from offbroadway.daemon.shell.steps import Step, Steps, order


def names(steps: list[Step]) -> list[str]:
    return [s.name for s in steps]


def test_a_step_starts_after_what_it_requires_and_otherwise_as_declared() -> None:
    steps = [Step("tree", requires=("hub", "lock")), Step("lock"),
             Step("hub", requires=("lock",)), Step("metrics")]
    assert names(order(steps)) == ["lock", "hub", "tree", "metrics"]
    assert names(order([Step("a"), Step("b"), Step("c")])) == ["a", "b", "c"]


@pytest.mark.parametrize("steps, why", [
    ([Step("a", requires=("b",)), Step("b", requires=("a",))], "require each other"),
    ([Step("a", requires=("nowhere",))], "no step provides"),
    ([Step("a"), Step("a")], "declared twice"),
])
def test_a_circle_an_unknown_requirement_or_a_twin_is_refused(steps, why) -> None:
    with pytest.raises(ValueError, match=why):
        order(steps)


def _recording(log: list[str], fail: str | None = None,
               fail_stop: str | None = None) -> list[Step]:
    def start(name: str):
        async def go() -> None:        # a coroutine and a plain function are both steps
            if name == fail:
                raise RuntimeError(f"{name} did not start")
            log.append(f"start {name}")
        return go

    def stop(name: str):
        def go() -> None:
            log.append(f"stop {name}")
            if name == fail_stop:
                raise RuntimeError(f"{name} did not stop")
        return go

    spec = [("lock", ()), ("metrics", ("lock",)), ("hub", ("lock",)),
            ("control", ("hub",)), ("tree", ("hub", "control", "metrics"))]
    return [Step(n, start(n), stop(n), r) for n, r in spec]


def test_the_stop_is_the_start_in_reverse() -> None:
    log: list[str] = []
    steps = Steps(_recording(log))

    async def run() -> None:
        await steps.start()
        await steps.stop()
    asyncio.run(run())
    assert log == ["start lock", "start metrics", "start hub", "start control", "start tree",
                   "stop tree", "stop control", "stop hub", "stop metrics", "stop lock"]
    assert steps.started == []


def test_a_step_that_failed_to_start_is_not_stopped_nor_the_ones_after_it_started() -> None:
    log: list[str] = []
    steps = Steps(_recording(log, fail="hub"))

    async def run() -> None:
        try:
            with pytest.raises(RuntimeError, match="hub did not start"):
                await steps.start()
        finally:
            await steps.stop()
    asyncio.run(run())
    assert log == ["start lock", "start metrics", "stop metrics", "stop lock"]


def test_a_stop_that_raises_does_not_keep_the_others_from_stopping() -> None:
    log: list[str] = []
    steps = Steps(_recording(log, fail_stop="control"))

    async def run() -> None:
        await steps.start()
        with pytest.raises(RuntimeError, match="control did not stop"):
            await steps.stop()
    asyncio.run(run())
    assert log[5:] == ["stop tree", "stop control", "stop hub", "stop metrics", "stop lock"]


def test_the_daemon_assigns_every_attribute_in_its_init() -> None:
    """What a Daemon has is read in one place: an attribute first assigned in a step or in
    the run would be missing from every path that runs before it (a failed start, a stop
    during the start)."""
    import ast
    from pathlib import Path

    source = Path(__file__).resolve().parents[2] / "daemon" / "shell" / "app.py"
    cls = next(n for n in ast.parse(source.read_text()).body
               if isinstance(n, ast.ClassDef) and n.name == "Daemon")

    def assigned(fn: ast.AST) -> set[str]:
        out = set()
        for node in ast.walk(fn):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign))
                       else [])
            for t in targets:
                for e in ast.walk(t):
                    if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) \
                            and e.value.id == "self":
                        out.add(e.attr)
        return out

    methods = [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    init = assigned(next(m for m in methods if m.name == "__init__"))
    later = {a: m.name for m in methods if m.name != "__init__" for a in assigned(m)}
    assert "steps" in init and "root" in init
    assert not set(later) - init, {a: m for a, m in later.items() if a not in init}
