"""daemon/spark/wiring.py: the wiring, without starting Spark."""

from __future__ import annotations

import json

from offbroadway.daemon.spark.settings import ARGV, ServerSettings
from offbroadway.daemon.spark.wiring import plan

from tests.spark.conftest import spark_config


def test_local_plan_fresh_token_and_port_per_start(tmp_path):
    p = plan(spark_config(tmp_path), runtime_dir=str(tmp_path / "run"),
             state_dir=str(tmp_path / "state"))
    assert p.child is not None and p.child.id == "spark"
    assert tuple(p.child.argv) == ARGV
    assert p.child.start_timeout >= 60 and p.child.heartbeat_timeout
    assert callable(p.child.env)
    assert p.committer_env() == {}          # nothing started yet
    first = dict(p.child.env())
    bp1 = p.committer_env()
    second = dict(p.child.env())
    bp2 = p.committer_env()
    assert first["OFFBROADWAY_SPARK_TOKEN"] != second["OFFBROADWAY_SPARK_TOKEN"]
    assert first["OFFBROADWAY_SPARK_DIR"] == str(tmp_path / "state" / "spark")
    assert first["SPARK_LOCAL_IP"] == "127.0.0.1"
    for env, bp in ((first, bp1), (second, bp2)):
        assert bp["OFFBROADWAY_SPARK_TOKEN"] == env["OFFBROADWAY_SPARK_TOKEN"]
        assert bp["OFFBROADWAY_SPARK_REMOTE"] == f"sc://localhost:{env['OFFBROADWAY_SPARK_PORT']}"
    text = json.dumps(p.settings)                  # JSON-serialisable, and token-free
    assert first["OFFBROADWAY_SPARK_TOKEN"] not in text
    assert "remote" not in p.settings and p.settings["output"].endswith("out")
    assert first["OFFBROADWAY_SPARK_TOKEN"] not in repr(p)


def test_fixed_port_is_kept(tmp_path):
    p = plan(spark_config(tmp_path, port=15123), runtime_dir=str(tmp_path), state_dir="")
    assert p.child is not None
    assert dict(p.child.env())["OFFBROADWAY_SPARK_PORT"] == "15123"
    assert p.committer_env()["OFFBROADWAY_SPARK_REMOTE"] == "sc://localhost:15123"


def test_remote_plan_starts_nothing(tmp_path):
    p = plan(spark_config(tmp_path, remote="sc://spark.example:15002", token_env="SPARK_TOK"),
             runtime_dir=str(tmp_path), state_dir=str(tmp_path))
    assert p.child is None
    assert p.committer_env() == {}
    assert p.settings["remote"] == "sc://spark.example:15002"
    assert p.settings["token_env"] == "SPARK_TOK" and "token_file" not in p.settings
    json.dumps(p.settings)


def test_conf_reaches_the_server_and_round_trips(tmp_path):
    """``[spark] conf`` (validated in daemon/config/load.py) travels in the server's settings
    record; what the daemon writes, the wrapper reads back unchanged."""
    p = plan(spark_config(tmp_path, conf={"spark.sql.shuffle.partitions": "4"},
                          master="local[1]", driver_memory="2g"),
             runtime_dir=str(tmp_path), state_dir=str(tmp_path / "state"))
    assert p.child is not None
    env = dict(p.child.env())
    back = ServerSettings.from_env(env)
    assert back.conf == {"spark.sql.shuffle.partitions": "4"}
    assert (back.master, back.driver_memory) == ("local[1]", "2g")
    assert back.port == int(env["OFFBROADWAY_SPARK_PORT"]) and back.token == \
        env["OFFBROADWAY_SPARK_TOKEN"]
    assert ServerSettings.from_env(back.to_env()) == back
