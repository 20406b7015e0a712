"""The spec tree's facts (supervision.tree): the walk, parents, workers, and who absorbs a
crash, with OTP's escalation through supervisors that allow no restart."""

from __future__ import annotations

from offbroadway.supervision import SpecTree, SupervisorSpec, WorkerSpec, workers_under
from offbroadway.supervision.tree import snapshot_find, snapshot_lineage, snapshot_nodes, walk


def _w(wid: str) -> WorkerSpec:
    return WorkerSpec(id=wid, argv=["true"])


def _tree() -> SupervisorSpec:
    return SupervisorSpec(id="root", strategy="rest_for_one", max_restarts=5, children=[
        _w("a"),
        SupervisorSpec(id="ones", strategy="one_for_one", children=[_w("b0"), _w("b1")]),
        SupervisorSpec(id="all0", strategy="one_for_all", max_restarts=0, children=[
            _w("c0"),
            SupervisorSpec(id="inner0", strategy="one_for_all", max_restarts=0,
                           children=[_w("d0"), _w("d1")])]),
        _w("e"),
    ])


def test_walk_is_depth_first_in_start_order_and_workers_are_its_leaves() -> None:
    root = _tree()
    assert [s.id for s in walk(root)] == ["root", "a", "ones", "b0", "b1", "all0", "c0",
                                         "inner0", "d0", "d1", "e"]
    assert [w.id for w in workers_under(root)] == ["a", "b0", "b1", "c0", "d0", "d1", "e"]
    assert [w.id for w in workers_under(_w("x"))] == ["x"]


def test_parents_and_workers_under_ids() -> None:
    t = SpecTree(_tree())
    assert t.parent_of("d1").id == "inner0"
    assert t.parent_of("root") is None
    assert t.workers(["ones", "e", "gone"]) == ["b0", "b1", "e"]


def test_a_crash_is_absorbed_by_the_first_supervisor_that_allows_a_restart() -> None:
    t = SpecTree(_tree())
    sup, failed = t.crash_target("b1")
    assert (sup.id, failed) == ("ones", "b1")
    # two supervisors with max_restarts 0 escalate: the root sees all0 fail
    sup, failed = t.crash_target("d0")
    assert (sup.id, failed) == ("root", "all0")
    assert t.restart_target("d0") == "all0"
    assert t.restarted_by("d0") == ["all0", "e"]          # rest_for_one from all0
    assert t.cascade("d0") == ["c0", "d0", "d1", "e"]
    assert t.cascade("b0") == ["b0"]
    assert t.crash_target("root") == (None, "root")
    assert t.cascade("root") == ["a", "b0", "b1", "c0", "d0", "d1", "e"]


def _snapshot(spec) -> dict:
    """A snapshot of ``spec``'s tree in the shape ``Supervisor.snapshot`` gives."""
    sup = isinstance(spec, SupervisorSpec)
    return {"id": spec.id, "kind": "supervisor" if sup else "worker",
            "strategy": spec.strategy.value if sup else None, "pid": None,
            "state": "running", "restarts": 0,
            "children": [_snapshot(c) for c in spec.children] if sup else []}


def test_a_snapshot_is_walked_as_the_specs_are_with_ancestors_and_found_by_id() -> None:
    root = _tree()
    snap = _snapshot(root)
    assert [n["id"] for n in snapshot_nodes(snap)] == [s.id for s in walk(root)]
    lineage = {n["id"]: [a["id"] for a in above] for n, above in snapshot_lineage(snap)}
    assert lineage["root"] == [] and lineage["a"] == ["root"]
    assert lineage["d1"] == ["root", "all0", "inner0"]
    assert [n["id"] for n, _ in snapshot_lineage(snap)] == [s.id for s in walk(root)]
    assert snapshot_find(snap, "c0")["kind"] == "worker"
    assert snapshot_find(snap, "gone") is None
    assert [n["id"] for n in snapshot_nodes({"id": "lone"})] == ["lone"]
