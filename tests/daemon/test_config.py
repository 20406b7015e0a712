"""Config validation: every error names its dotted key; good configs come out typed."""

from __future__ import annotations

import copy

import pytest
from offbroadway.daemon.config.load import ConfigError, parse_size, validate

BASE = {
    "pipeline": {"name": "orders", "handler": "examples.orders:Orders"},
    "producer": {"source": "spool", "options": {"path": "var/spool"}},
    "processors": {"default": {"concurrency": 4, "max_demand": 10, "min_demand": 5}},
    "batchers": {"spark": {"batch_size": 1000, "batch_timeout": 1, "concurrency": 1}},
    "spark": {"master": "local[2]", "output": "var/out"},
    "runtime": {"dir": "/tmp/ob-run"},
}


def with_(path: str, value) -> dict:
    raw = copy.deepcopy(BASE)
    *parents, leaf = path.split(".")
    node = raw
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return raw


def test_the_base_config_is_valid_and_typed() -> None:
    config = validate(copy.deepcopy(BASE)).config
    assert config.processors["default"].max_demand == 10
    assert config.batchers["spark"].batch_timeout == 1.0
    assert isinstance(config.batchers["spark"].batch_timeout, float)
    assert config.spark.format == "parquet"
    assert config.metrics.listen == "127.0.0.1:9464"   # localhost by default


@pytest.mark.parametrize("path,value,fragment", [
    ("processors.default.max_demand", "ten", "expected an integer"),
    ("processors.default.max_demand", 0, "greater than 0"),
    ("processors.default.min_demand", 10, "below max_demand"),
    ("processors.default.concurrency", True, "boolean"),
    ("producer.source", "kafka", "must be one of"),
    ("producer.dispatcher", "random", "must be one of"),
    ("batchers.spark.batch_size", "lots", "not a size"),
    ("batchers.spark.batch_timeout", -1, "greater than 0"),
    ("batchers.spark.batch_sise", 10, "unknown key"),
    ("spark.format", "csv", "must be one of"),
    ("spark.remote", "http://x", "sc://"),
    ("pipeline.handler", "no_colon", "package.module:ClassName"),
    ("pipeline.shutdown_timeout", "1m", "expected a number"),
    ("metrics.listen", "9464", "host:port"),
    ("runtime.dir", "/tmp/" + "x" * 80, "too long for unix socket"),
    ("runtime.log_level", "loud", "must be one of"),
    ("surprise", {}, "unknown key"),
])
def test_errors_name_the_key(path: str, value, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate(with_(path, value))
    assert str(err.value).startswith(path), str(err.value)
    assert fragment in str(err.value)


def test_missing_required_keys_are_named() -> None:
    raw = copy.deepcopy(BASE)
    del raw["pipeline"]["handler"]
    with pytest.raises(ConfigError, match=r"^pipeline\.handler: required"):
        validate(raw)
    raw = copy.deepcopy(BASE)
    del raw["producer"]
    with pytest.raises(ConfigError, match=r"^producer: required"):
        validate(raw)


def test_only_the_default_processor_key_exists() -> None:
    with pytest.raises(ConfigError, match=r"^processors\.fast: unknown processor key"):
        validate(with_("processors.fast", {"concurrency": 1}))


def test_spark_needs_a_batcher() -> None:
    raw = copy.deepcopy(BASE)
    del raw["batchers"]
    with pytest.raises(ConfigError, match=r"^spark: .*batchers"):
        validate(raw)


def test_batch_size_in_bytes() -> None:
    b = validate(with_("batchers.spark.batch_size", "1MiB")).config.batchers["spark"]
    assert (b.batch_size, b.batch_bytes) == (1024 * 1024, True)
    assert parse_size("512MB") == 512_000_000
    assert parse_size(42) == 42


def test_warnings_explain_pitfalls() -> None:
    # Spark jobs are group commits now (small batches and short timeouts no longer mean
    # one Spark job each): what costs Spark's fixed per-job cost is a small commit_rows
    raw = with_("batchers.spark.batch_size", 10)
    raw["batchers"]["spark"]["batch_timeout"] = 0.05
    assert not validate(raw).warnings
    raw = with_("spark.commit_rows", 1000)
    warnings = validate(raw).warnings
    assert any(w.startswith("spark.commit_rows: 1000 rows per Spark job") for w in warnings)
    raw = with_("producer.source", "rabbitmq")
    raw["producer"]["options"] = {"prefetch_count": 5}
    warnings = validate(raw).warnings
    assert any("prefetch_count" in w and "starve" in w for w in warnings)


def test_source_options_are_checked_by_the_source() -> None:
    from offbroadway.daemon.config.checks import check_source

    config = validate(with_("producer.options", {"path": "var/spool", "patern": "*.x"})).config
    with pytest.raises(ConfigError, match=r"^producer\.options\.patern"):
        check_source(config)


def test_nats_gets_the_auto_prefetch_and_the_starvation_warning() -> None:
    from offbroadway.daemon.core.topology import auto_prefetch, build
    from offbroadway.stages.runtime.spec import StageSpec

    raw = with_("producer.source", "nats")
    raw["producer"]["options"] = {"stream": "orders"}
    config = validate(raw).config
    producer = build(config).root.children[0].children[0]
    spec = StageSpec.from_env(producer.env())
    assert spec.source_options["auto_prefetch"] == auto_prefetch(config) > 1000
    raw["producer"]["options"] = {"stream": "orders", "prefetch": 5}
    warnings = validate(raw).warnings
    assert any("producer.options.prefetch:" in w and "starve" in w for w in warnings)


def _rabbit_spark(producers: int = 1, **options) -> dict:
    """The README's job (two processors of 1000, batches of 2000, default Spark groups of
    200,000 rows) reading RabbitMQ."""
    raw = copy.deepcopy(BASE)
    raw["producer"] = {"source": "rabbitmq", "concurrency": producers,
                       "options": {"queue": "orders", **options}}
    raw["processors"]["default"] = {"concurrency": 2, "max_demand": 1000, "min_demand": 500}
    raw["batchers"]["spark"] = {"batch_size": 2000, "batch_timeout": 1, "concurrency": 1}
    return raw


def _spark_settings(config) -> dict:
    from offbroadway.daemon.spark.wiring import sink_settings

    return sink_settings(config.spark, "/tmp/ob-state")


def test_auto_prefetch_with_spark_fits_amqp_and_keeps_two_groups_in_flight() -> None:
    """With Spark, two commit groups per batcher are in flight (one written, one gathering):
    406,000 messages for one producer at the default 200,000 rows, which basic.qos cannot say
    (16 bits).  "auto" must be a window the broker accepts and that the tree, as built,
    holds exactly: the committers' group shrinks to what that window feeds, so Spark never
    waits for rows the broker holds back."""
    from offbroadway.daemon.core.topology import build
    from offbroadway.stages.runtime.spec import StageSpec
    from offbroadway.stages.sources.rabbitmq.settings import parse_options

    config = validate(_rabbit_spark()).config
    assert config.spark.commit_rows == 200_000
    topo = build(config, spark_settings=_spark_settings(config))
    producer = StageSpec.from_env(topo.root.children[0].children[0].env())
    auto = producer.source_options["auto_prefetch"]
    bp = topo.specs["batch_processor_spark_0"]
    tree_holds = 2 * 1000 + 2000 * (1 + bp.max_demand)     # processors + batcher
    assert auto == tree_holds <= 65535                     # what the tree holds, sayable
    assert parse_options(producer.source_options).prefetch_count == auto   # not clipped
    rows = topo.specs["committer_spark"].spark.commit_rows
    assert 0 < rows < 200_000
    assert bp.max_demand * 2000 >= 2 * rows                # two groups in flight fit

    from offbroadway.daemon.core.topology import auto_window, held

    window = auto_window(config)
    assert (window.prefetch, window.commit_rows) == (auto, rows)
    assert window.held == held(config, 200_000) == 406_000
    assert held(config, rows + 1) > 65535                  # the largest group that fits
    assert rows == 29_000 and auto == 64_000
    assert "65,535" in window.note and "406,000" in window.note and not window.waits
    assert "producer.concurrency = 7" in window.note


def test_auto_prefetch_is_left_whole_where_it_fits_or_is_explicit() -> None:
    from offbroadway.daemon.core.topology import auto_window, build

    # seven producers: 58,000 each fits basic.qos, the groups stay at 200,000
    seven = validate(_rabbit_spark(producers=7)).config
    assert auto_window(seven).prefetch == 58_000 and auto_window(seven).commit_rows == 200_000
    assert auto_window(seven).note is None
    # smaller groups set by hand: two producers of 53,000 keep groups of 50,000
    raw = _rabbit_spark(producers=2)
    raw["spark"]["commit_rows"] = 50_000
    two = validate(raw).config
    assert auto_window(two).prefetch == 53_000 and auto_window(two).commit_rows == 50_000
    # NATS has no 16-bit field: the whole window
    raw = _rabbit_spark()
    raw["producer"] = {"source": "nats", "options": {"stream": "orders"}}
    nats = validate(raw).config
    assert (auto_window(nats).prefetch, auto_window(nats).commit_rows) == (406_000, 200_000)
    # an explicit prefetch_count is the user's: the groups keep their size
    fixed = validate(_rabbit_spark(prefetch_count=5000)).config
    assert auto_window(fixed).commit_rows == 200_000
    topo = build(fixed, spark_settings=_spark_settings(fixed))
    assert topo.specs["committer_spark"].spark.commit_rows == 200_000


def test_rate_limit_is_validated() -> None:
    assert validate(BASE).config.producer.rate_limit is None
    raw = with_("producer.rate_limit", {"allowed_messages": 500, "interval": 1})
    assert validate(raw).config.producer.rate_limit == (500, 1.0)
    for bad, key in [({"allowed_messages": 0, "interval": 1}, "allowed_messages"),
                     ({"allowed_messages": 5}, "interval"),
                     ({"allowed_messages": 5, "interval": 0}, "interval"),
                     ({"allowed_messages": 5, "interval": 1, "burst": 2}, "burst"),
                     ({"allowed_messages": True, "interval": 1}, "allowed_messages")]:
        with pytest.raises(ConfigError, match=rf"^producer\.rate_limit\.{key}"):
            validate(with_("producer.rate_limit", bad))
    with pytest.raises(ConfigError, match=r"^producer\.rate_limit"):
        validate(with_("producer.rate_limit", "500/1"))


def test_spark_conf_is_flattened_and_checked() -> None:
    """``[spark] conf``: Spark properties for the local server, quoted or not (TOML reads
    an unquoted dotted key as nested tables), values as Spark reads them (text)."""
    import tomllib

    text = ('[spark.conf]\nspark.sql.shuffle.partitions = 4\n'
            '"spark.sql.parquet.compression.codec" = "zstd"\nspark.ui.enabled = false\n')
    raw = copy.deepcopy(BASE)
    raw["spark"].update(tomllib.loads(text)["spark"])
    assert validate(raw).config.spark.conf == {
        "spark.sql.shuffle.partitions": "4", "spark.sql.parquet.compression.codec": "zstd",
        "spark.ui.enabled": "false"}
    for conf, fragment in (({"sql.shuffle.partitions": 4}, "not a Spark property"),
                           ({"spark.driver.bindAddress": "0.0.0.0"}, "set by offbroadway"),
                           ({"spark.master": "local[4]"}, "use spark.master"),
                           ({"spark.x": [1]}, "string, number or boolean")):
        with pytest.raises(ConfigError) as err:
            validate(with_("spark.conf", conf))
        assert str(err.value).startswith("spark.conf."), str(err.value)
        assert fragment in str(err.value)
    raw = with_("spark.conf", {"spark.sql.shuffle.partitions": 4})
    raw["spark"]["remote"] = "sc://spark.example:15002"
    with pytest.raises(ConfigError, match=r"^spark\.conf: .*remote"):
        validate(raw)


def test_spark_defaults_and_the_exactly_once_switch() -> None:
    """Groups of 200,000 rows or 4 s by default; ``exactly_once`` on by default, off on
    request (the committer is told through its settings), anything else refused on one
    line naming the key."""
    spark = validate(BASE).config.spark
    assert (spark.commit_rows, spark.commit_interval, spark.exactly_once) == \
        (200_000, 4.0, True)
    assert _spark_settings(validate(BASE).config)["exactly_once"] is True
    off = validate(with_("spark.exactly_once", False)).config
    assert off.spark.exactly_once is False and _spark_settings(off)["exactly_once"] is False
    for bad in ("no", 0, 1, "false"):
        with pytest.raises(ConfigError) as err:
            validate(with_("spark.exactly_once", bad))
        assert str(err.value).startswith("spark.exactly_once: expected a boolean"), err.value
        assert "\n" not in str(err.value)


def test_reload_refuses_a_spark_change_naming_the_key() -> None:
    from offbroadway.daemon.core import reload

    old = validate(copy.deepcopy(BASE)).config
    for path, value in (("spark.commit_rows", 20_000), ("spark.partition_by", ["sku"]),
                        ("spark.conf", {"spark.sql.shuffle.partitions": 4})):
        with pytest.raises(reload.ReloadRefused, match=rf"{path.replace('.', '[.]')}"):
            reload.plan(old, validate(with_(path, value)).config)


@pytest.mark.parametrize("section,typo,says", [
    ("spark", "tabel", "spark.tabel: unknown key; did you mean 'table'?"),
    ("batchers.spark", "batch_sise", "batchers.spark.batch_sise: unknown key; did you mean "
                                     "'batch_size'?"),
    ("processors.default", "concurency", "processors.default.concurency: unknown key; did "
                                         "you mean 'concurrency'?"),
    ("producer", "concurency", "producer.concurency: unknown key; did you mean "
                               "'concurrency'?"),
    ("pipeline", "nmae", "pipeline.nmae: unknown key; did you mean 'name'?"),
])
def test_a_typo_is_named_with_the_key_it_is_close_to(section: str, typo: str, says: str
                                                     ) -> None:
    raw = copy.deepcopy(BASE)
    table = raw
    for part in section.split("."):
        table = table[part]
    table[typo] = table.pop(typo.replace("tabel", "output").replace("nmae", "name")) \
        if typo in ("tabel", "nmae") else 1
    with pytest.raises(ConfigError) as err:
        validate(raw)
    assert str(err.value) == says


def test_unknown_keys_are_reported_before_missing_ones() -> None:
    """``[spark] tabel = "x"`` (no output): the typo, not "spark.output: required"."""
    raw = copy.deepcopy(BASE)
    del raw["spark"]["output"]
    raw["spark"]["tabel"] = "orders"
    with pytest.raises(ConfigError, match=r"^spark\.tabel: unknown key; did you mean 'table'"):
        validate(raw)
    raw = copy.deepcopy(BASE)
    raw["producer"]["rate_limit"] = {"allowed_mesages": 10, "interval": 1}
    with pytest.raises(ConfigError, match=r"^producer\.rate_limit\.allowed_mesages: unknown "
                                          r"key; did you mean 'allowed_messages'"):
        validate(raw)
    del raw["producer"]["rate_limit"]["allowed_mesages"]
    with pytest.raises(ConfigError, match=r"^producer\.rate_limit\.allowed_messages: required"):
        validate(raw)
    raw = copy.deepcopy(BASE)
    del raw["pipeline"]["name"]
    raw["pipeline"]["handlr"] = raw["pipeline"].pop("handler")
    with pytest.raises(ConfigError, match=r"^pipeline\.handlr: unknown key; did you mean "
                                          r"'handler'"):
        validate(raw)


def test_a_misspelt_section_gets_a_hint() -> None:
    raw = copy.deepcopy(BASE)
    raw["sparks"] = raw.pop("spark")
    with pytest.raises(ConfigError, match=r"^sparks: unknown key; did you mean \[spark\]\?"):
        validate(raw)


def test_a_misspelt_source_option_gets_a_hint(tmp_path) -> None:
    from offbroadway.daemon.config.checks import check_source

    raw = copy.deepcopy(BASE)
    raw["producer"] = {"source": "rabbitmq", "options": {"url": "amqp://127.0.0.1",
                                                         "queu": "orders"}}
    with pytest.raises(ConfigError) as err:
        check_source(validate(raw).config)
    assert str(err.value).startswith(
        "producer.options.queu: rabbitmq source: unknown option 'queu'; did you mean 'queue'?")


def test_schema_is_a_ddl_or_fixed_or_evolve() -> None:
    for value, ddl, evolve in (("", "", False), ("fixed", "", False), ("evolve", "", True),
                               ("a BIGINT", "a BIGINT", False)):
        spark = validate(with_("spark.schema", value)).config.spark
        assert (spark.schema, spark.evolve) == (ddl, evolve)
