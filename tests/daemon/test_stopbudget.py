"""The stop budget is the drain plus every stage's grace, read from the specs the
supervisors obey (daemon/core/stopbudget.py)."""

from __future__ import annotations

from offbroadway.daemon.config.load import load_config
from offbroadway.daemon.core import stopbudget
from offbroadway.daemon.spark.wiring import stop_budget, wired
from offbroadway.supervision.spec import BRUTAL_KILL, Strategy, SupervisorSpec, WorkerSpec
from offbroadway.supervision.tree import stop_bound

from tests.conftest import REPO


def w(i: str, shutdown: float | str = 5.0) -> WorkerSpec:
    return WorkerSpec(id=i, argv=("true",), shutdown=shutdown)


def test_workers_stop_one_after_the_other_and_a_supervisor_shutdown_caps_its_subtree():
    inner = SupervisorSpec(id="inner", strategy=Strategy.ONE_FOR_ALL,
                           children=[w("a", 30.0), w("b", 30.0)], shutdown=10.0)
    root = SupervisorSpec(id="root", strategy=Strategy.REST_FOR_ONE,
                          children=[w("x"), w("y", BRUTAL_KILL), inner])
    assert stop_bound(inner, stopbudget.KILL_SLACK) == 10.0 + 2 * stopbudget.KILL_SLACK
    assert stop_bound(root, stopbudget.KILL_SLACK) == (5.0 + 1.0) + 1.0 + 12.0
    assert stopbudget.total(7.0, root) == 7.0 + 19.0 + stopbudget.MARGIN


def test_the_example_config_budget():
    """60 s drain + batch processor 60 s + Spark 15 s + producer, two processors and the
    batcher 5 s each, 1 s per stage to reap, 5 s for the daemon, and the Spark
    committer's 60 s grace plus 1 s to reap: what check prints."""
    config = load_config(str(REPO / "config" / "example.toml")).config
    assert stop_budget(config) == 60 + (60 + 15 + 4 * 5) + 6 * 1 + 5 + (60 + 1) == 227


def test_check_and_the_docs_quote_the_one_budget(tmp_path):
    """The figure ``check`` prints and the example in docs/operations.md are the one that
    daemon/core/stopbudget.py computes (they once said 166 s where check printed 227 s)."""
    import re
    import subprocess

    from tests.conftest import offbroadway_cmd, test_env

    example = REPO / "config" / "example.toml"
    config = load_config(str(example)).config
    root = wired(config).root
    budget = stopbudget.total(config.pipeline.shutdown_timeout, root)
    assert budget == stop_budget(config)
    doc = (REPO / "docs" / "operations.md").read_text()
    quoted = re.findall(r"a stop takes at most (\d+) s", doc)
    assert quoted and {float(q) for q in quoted} == {budget}
    assert f"(the example config: {stopbudget.explain(config, root)};" in " ".join(doc.split())
    assert stopbudget.explain(config, root).endswith(f"= {budget:g} s")
    (tmp_path / "spool").mkdir()     # the example's, where this check can find one
    copy = tmp_path / "example.toml"
    copy.write_text(example.read_text().replace('path = "var/spool"',
                                                f'path = "{tmp_path / "spool"}"'))
    out = subprocess.run(offbroadway_cmd("check", str(copy)), cwd=REPO, env=test_env(),
                         capture_output=True, text=True, timeout=120)
    assert f"a stop takes at most {budget:g} s)" in out.stdout, out.stdout + out.stderr
