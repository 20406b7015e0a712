"""Bad input through both ``check`` and ``run``: the same exit code, one line naming the key
or the cause, no traceback, and nothing left in the runtime dir.

``check`` is the unit's ``ExecStartPre``: whatever ``run`` refuses at start must be refused
by ``check`` first, with the same words.  Each case is a real config file given to the real
CLI in a subprocess; a case that ``run`` accepted would start a daemon, and the timeout
turns that into a failure instead of a hang.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, test_env

EXIT_CONFIG = 2
#: the daemon's CLI, with an optional prelude (to make pyspark unimportable)
CLI = "from offbroadway.daemon.cli import main; sys.exit(main(sys.argv[1:]))"


def toml(raw: dict, prefix: str = "") -> str:
    """A minimal TOML writer (tables, strings, numbers, booleans, arrays of scalars)."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float, str, list)):
            return json.dumps(v)
        raise TypeError(v)

    lines = []
    scalars = {k: v for k, v in raw.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in raw.items() if isinstance(v, dict)}
    if prefix:
        lines.append(f"[{prefix}]")
    lines += [f"{json.dumps(k)} = {value(v)}" for k, v in scalars.items()]
    for k, v in tables.items():
        lines.append(toml(v, f"{prefix}.{k}" if prefix else k))
    return "\n".join(lines) + "\n"


def base(root: Path) -> dict:
    (root / "spool").mkdir(exist_ok=True)
    return {
        "pipeline": {"name": "bad", "handler": "examples.orders:Orders"},
        "producer": {"source": "spool", "options": {"path": str(root / "spool")}},
        "processors": {"default": {"concurrency": 2, "max_demand": 10}},
        "metrics": {"listen": ""},
        "runtime": {"dir": str(root / "run"), "state_dir": str(root / "state")},
    }


def spark_base(root: Path) -> dict:
    raw = base(root)
    raw["batchers"] = {"spark": {"batch_size": 1000, "batch_timeout": 1.0}}
    raw["spark"] = {"output": str(root / "out")}
    return raw


def set_(path: str, value: Any, start: Callable[[Path], dict] = base
         ) -> Callable[[Path], dict]:
    def make(root: Path) -> dict:
        raw = start(root)
        *parents, leaf = path.split(".")
        node = raw
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
        return raw
    return make


def drop(path: str) -> Callable[[Path], dict]:
    def make(root: Path) -> dict:
        raw = base(root)
        *parents, leaf = path.split(".")
        node = raw
        for p in parents:
            node = node[p]
        del node[leaf]
        return raw
    return make


def file_at(name: str, then: Callable[[Path, dict], None]) -> Callable[[Path], dict]:
    """Make ``root/name`` a regular file, then change the config to point at or under it."""
    def make(root: Path) -> dict:
        raw = base(root)
        (root / name).write_text("not a directory\n")
        then(root, raw)
        return raw
    return make


def long_batcher_key(root: Path) -> dict:
    # a runtime dir that leaves room for every fixed name, and a 60-character batcher key
    raw = base(root)
    key = "k" * 60
    raw["batchers"] = {key: {"batch_size": 10}}
    raw["runtime"]["dir"] = str(root / ("run-" + "r" * 16))
    return raw


def open_runtime_dir(root: Path) -> dict:
    raw = base(root)
    (root / "run").mkdir()
    (root / "run").chmod(0o777)
    return raw


def renamed_section(root: Path) -> dict:
    raw = base(root)
    raw["pipelin"] = raw.pop("pipeline")
    return raw


# (id, config maker, fragment the one line must contain, how to run the CLI)
CASES: list[tuple[str, Callable[[Path], dict] | str, str, str]] = [
    # -- the cases the first user found already handled ------------------------------------
    ("max_demand-type", set_("processors.default.max_demand", "ten"),
     "processors.default.max_demand: expected an integer", ""),
    ("max_demand-zero", set_("processors.default.max_demand", 0),
     "processors.default.max_demand: must be greater than 0", ""),
    ("min_demand", set_("processors.default.min_demand", 10),
     "processors.default.min_demand", ""),
    ("concurrency-bool", set_("processors.default.concurrency", True),
     "processors.default.concurrency: expected an integer, got a boolean", ""),
    ("source-unknown", set_("producer.source", "kafka"), "producer.source: must be one of", ""),
    ("dispatcher", set_("producer.dispatcher", "random"), "producer.dispatcher", ""),
    ("batch_size", set_("batchers.b.batch_size", "lots"), "batchers.b.batch_size: not a size",
     ""),
    ("batch_timeout", set_("batchers.b.batch_timeout", -1), "batchers.b.batch_timeout", ""),
    ("batcher-typo", set_("batchers.b.batch_sise", 10), "batchers.b.batch_sise: unknown key",
     ""),
    ("spark-format", set_("spark.format", "csv", spark_base), "spark.format: must be one of",
     ""),
    ("spark-remote", set_("spark.remote", "http://x", spark_base), "spark.remote", ""),
    ("handler-shape", set_("pipeline.handler", "no_colon"), "pipeline.handler", ""),
    ("handler-missing", set_("pipeline.handler", "nosuchmodule_xyz:Orders"),
     "pipeline.handler: cannot load", ""),
    ("handler-no-handle_message", set_("pipeline.handler",
                                       "tests.daemon.bad_handlers:NoHandleMessage"),
     "pipeline.handler", ""),
    ("shutdown_timeout", set_("pipeline.shutdown_timeout", "1m"),
     "pipeline.shutdown_timeout: expected a number", ""),
    ("metrics-listen", set_("metrics.listen", "9464"), "metrics.listen", ""),
    ("runtime-dir-too-long", set_("runtime.dir", "/tmp/" + "x" * 80),
     "runtime.dir: the socket", ""),
    ("log_level", set_("runtime.log_level", "loud"), "runtime.log_level", ""),
    ("unknown-top-key", set_("surprise", {"a": 1}), "surprise: unknown key", ""),
    ("handler-required", drop("pipeline.handler"), "pipeline.handler: required", ""),
    ("producer-required", drop("producer"), "producer: required", ""),
    ("processor-key", set_("processors.fast", {"concurrency": 1}),
     "processors.fast: unknown processor key", ""),
    ("spark-without-batcher", set_("spark", {"output": "/tmp/x"}), "spark:", ""),
    ("source-option-typo", set_("producer.options.patern", "*.x"),
     "producer.options.patern", ""),
    ("source-option-type", set_("producer.options.scan_interval", "often"),
     "producer.options.scan_interval", ""),
    ("not-toml", "[pipeline\nname = ", "not valid TOML", ""),
    # -- what check let through and run refused with a traceback ----------------------------
    ("spool-missing", set_("producer.options.path", "/nonexistent-ob-spool"),
     "producer.options.path: spool source: option 'path': '/nonexistent-ob-spool' does not "
     "exist", ""),
    ("spool-is-a-file", file_at("spoolfile", lambda root, raw: raw["producer"]["options"]
                                .__setitem__("path", str(root / "spoolfile"))),
     "producer.options.path: spool source: option 'path'", ""),
    ("handler-init-raises", set_("pipeline.handler", "tests.daemon.bad_handlers:RaisingInit"),
     "pipeline.handler: tests.daemon.bad_handlers:RaisingInit() raised RuntimeError: cannot "
     "reach the pricing table", ""),
    ("handler-init-exits", set_("pipeline.handler", "tests.daemon.bad_handlers:ExitsInInit"),
     "pipeline.handler: tests.daemon.bad_handlers:ExitsInInit() raised SystemExit: 4", ""),
    ("long-batcher-key", long_batcher_key, "batchers." + "k" * 60 + ": the socket", ""),
    ("runtime-dir-under-a-file", file_at("afile", lambda root, raw: raw["runtime"]
                                         .__setitem__("dir", str(root / "afile" / "run"))),
     "runtime.dir: ", ""),
    ("runtime-dir-is-a-file", file_at("afile", lambda root, raw: raw["runtime"]
                                      .__setitem__("dir", str(root / "afile"))),
     "is a file, not a directory", ""),
    ("state-dir-under-a-file", file_at("afile", lambda root, raw: raw["runtime"]
                                       .__setitem__("state_dir", str(root / "afile" / "s"))),
     "runtime.state_dir: ", ""),
    ("runtime-dir-open-to-others", open_runtime_dir,
     "is writable by group/others (mode 777)", ""),
    ("pyspark-missing", spark_base, "spark: pyspark is not installed", "no-pyspark"),
    ("no-java", spark_base, "spark: the local Spark server needs Java", "no-java"),
    ("section-typo", renamed_section, "pipelin: unknown key; did you mean [pipeline]?", ""),
]


def run_cli(verb: str, config: Path, how: str, root: Path) -> subprocess.CompletedProcess:
    env = test_env()
    prelude = "import sys; "
    if how == "no-pyspark":
        prelude += "sys.modules['pyspark'] = None; "   # what an uninstalled package looks like
    if how == "no-java":
        env.pop("JAVA_HOME", None)
        empty = root / "emptybin"
        empty.mkdir(exist_ok=True)
        env["PATH"] = str(empty)
    return subprocess.run([sys.executable, "-c", prelude + CLI, verb, str(config)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("verb", ["check", "run"])
def test_bad_input(case, verb: str, short_tmp: Path) -> None:
    _id, make, fragment, how = case
    root = short_tmp
    config = root / "c.toml"
    raw = make if isinstance(make, str) else None
    config.write_text(raw if raw is not None else toml(make(root)))
    try:
        res = run_cli(verb, config, how, root)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{verb} accepted the config and ran")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == EXIT_CONFIG, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr + res.stdout
    assert len(lines) == 1, res.stderr
    assert fragment in lines[0], lines[0]
    assert lines[0].startswith(f"offbroadway: invalid config {config}: ")
    # nothing created: no runtime dir (or an empty one the case made), no state dir
    assert set(os.listdir(root)) <= {"c.toml", "spool", "afile", "spoolfile", "emptybin",
                                     "run"}, sorted(os.listdir(root))
    assert not (root / "run").exists() or not any((root / "run").iterdir())


def test_check_says_what_it_cannot_tell(short_tmp: Path) -> None:
    """A broker source: ``check`` is ok and says the broker was not contacted."""
    raw = base(short_tmp)
    raw["producer"] = {"source": "redis", "options": {"stream": "s", "group": "g",
                                                      "url": "redis://:secret@127.0.0.1:1/0"}}
    config = short_tmp / "c.toml"
    config.write_text(toml(raw))
    res = run_cli("check", config, "", short_tmp)
    assert res.returncode == 0, res.stderr
    assert "not contacted by check" in res.stdout
    assert "secret" not in res.stdout


@pytest.mark.parametrize("make", [base, spark_base], ids=["spool", "spark"])
def test_the_base_configs_pass_check(make, short_tmp: Path) -> None:
    """Every bad case above is one change away from a config ``check`` accepts."""
    config = short_tmp / "c.toml"
    config.write_text(toml(make(short_tmp)))
    res = run_cli("check", config, "", short_tmp)
    assert res.returncode == 0, res.stderr
    assert set(os.listdir(short_tmp)) <= {"c.toml", "spool"}
