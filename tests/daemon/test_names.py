"""Stage ids are built and read back in one module: every id reads back to the role, key
and index it was built from, the topology's ids are those, and no other module of the
package or the benches spells a stage id by hand."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from offbroadway.daemon.config import names
from offbroadway.daemon.config.load import validate
from offbroadway.daemon.core import topology as topo_mod

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("api", "daemon", "stages", "supervision", "bench")
ROLES = "producer|processor|batcher|batch_processor|committer"
#: an id built by f-string (``f"batcher_{key}"``, ``f'batch_processor_spark_{i}'``) or read
#: by its prefix (``sid.startswith("producer_")``, ``prefix = f"committer_"``)
BY_HAND = re.compile(rf"""f["']({ROLES})_[\w-]*\{{|startswith\(\s*["']({ROLES})_""")

#: batcher keys are letters, digits, '_' and '-' (config validation)
keys = st.text(alphabet="abcXYZ019_-", min_size=1, max_size=12)
indexes = st.integers(min_value=0, max_value=10_000)


@given(key=keys, index=indexes)
def test_every_id_reads_back_to_what_built_it(key: str, index: int) -> None:
    built = {
        names.producer_id(index): (names.PRODUCER, None, index),
        names.processor_id(key, index): (names.PROCESSOR, key, index),
        names.batcher_id(key): (names.BATCHER, key, None),
        names.batch_processor_id(key, index): (names.BATCH_PROCESSOR, key, index),
        names.committer_id(key): (names.COMMITTER, key, None),
    }
    assert len(built) == 5, "two roles gave the same id"
    for sid, (role, k, i) in built.items():
        assert names.stage_id(role, k, i) == sid
        assert names.parse(sid) == (role, k, i), sid
        assert names.role_of(sid) == role
        assert names.key_of(sid) == k
        assert names.index_of(sid) == (-1 if i is None else i)


def test_the_shapes_are_the_ones_on_disk_and_in_status() -> None:
    # the ids name sockets, metrics and status rows: their spelling is part of the interface
    assert names.producer_id(3) == "producer_3"
    assert names.processor_ids("default", 2) == ["processor_default_0", "processor_default_1"]
    assert names.batcher_id("s3_x") == "batcher_s3_x"
    assert names.batch_processor_ids("s3_x", 2) == ["batch_processor_s3_x_0",
                                                    "batch_processor_s3_x_1"]
    assert names.committer_id("spark") == "committer_spark"


@pytest.mark.parametrize("sid", [
    "spark", "terminator", "PipelineSupervisor", "BatcherSupervisor_spark",
    "producer_", "producer_x", "producer_1_2", "processor_0", "processor_default_",
    "batch_processor_spark", "batch_processor__0", "batcher_", "committer_", "producer_²",
])
def test_anything_else_is_not_a_stage(sid: str) -> None:
    assert names.parse(sid) is None
    assert names.role_of(sid) is None
    assert names.index_of(sid) == -1


@pytest.mark.parametrize("role,key,index", [
    ("worker", None, 0), ("producer", "k", 0), ("producer", None, None),
    ("batcher", None, None), ("batcher", "k", 0), ("committer", "", None),
    ("processor", "default", -1),
])
def test_no_id_for_a_stage_that_cannot_exist(role: str, key: str | None,
                                             index: int | None) -> None:
    with pytest.raises(ValueError):
        names.stage_id(role, key, index)


def test_the_topology_builds_its_ids_from_the_names() -> None:
    raw = {
        "pipeline": {"name": "t", "handler": "examples.orders:Orders"},
        "producer": {"source": "spool", "options": {"path": "var/spool"}, "concurrency": 2},
        "processors": {"default": {"concurrency": 3}},
        "batchers": {"s_1": {"batch_size": 10, "concurrency": 2},
                     "b-2": {"batch_size": 10, "concurrency": 1}},
        "runtime": {"dir": "/tmp/ob-run"},
    }
    topo = topo_mod.build(validate(raw).config, sized=False, spark_settings={"commit_rows": 100})
    assert topo.committers == ["committer_s_1", "committer_b-2"]
    for sid, spec in topo.specs.items():
        name = names.parse(sid)
        assert name is not None and name.role == spec.role == topo.roles[sid], sid
        assert name.key == (spec.batcher or ("default" if spec.role == "processor" else None))
        if name.index is not None:
            assert name.index == spec.index
    assert topo.by_batcher == {"s_1": names.batch_processor_ids("s_1", 2),
                               "b-2": names.batch_processor_ids("b-2", 1)}
    # what validation names the sockets by without building the tree
    assert topo.stages == names.pipeline_ids(2, {"default": 3}, {"s_1": 2, "b-2": 1}, True)
    assert topo.stages[:5] == names.pipeline_ids(2, {"default": 3}, {}, False)


def test_the_pattern_finds_an_id_spelled_by_hand() -> None:
    # the scan below is only as good as this pattern
    for line in ('bid = f"batcher_{key}"', "x = f'batch_processor_spark_{i}'",
                 'if n["id"].startswith("producer_"):', 'f"committer_{k}"'):
        assert BY_HAND.search(line), line
    for line in ('names.batcher_id(key)', 'f"{pipeline} producer_{i}"', '"batcher_default"'):
        assert not BY_HAND.search(line), line


def test_no_stage_id_is_spelled_outside_the_names_module() -> None:
    own = ROOT / "daemon" / "config" / "names.py"
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))
             if p != own
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if BY_HAND.search(line)]
    assert not found, ("stage ids built or parsed by hand (use offbroadway.daemon.config.names):\n"
                       + "\n".join(found))
