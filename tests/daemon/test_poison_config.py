"""``max_crashes`` and the pipeline supervisor's intensity: validated, defaulted from each
other, warned about when a poison message could not be dead-lettered, and in the tree."""

from __future__ import annotations

import pytest
from offbroadway.daemon.config.load import ConfigError, validate
from offbroadway.daemon.core import topology

from tests.daemon.test_config import with_


def test_defaults_let_one_poison_message_through_the_pipeline_intensity() -> None:
    loaded = validate(with_("runtime.dir", "/tmp/ob-run"))
    config = loaded.config
    assert config.processors["default"].max_crashes == 3
    assert (config.pipeline.max_restarts, config.pipeline.max_seconds) == (4, 10.0)
    assert not [w for w in loaded.warnings if "max_restarts" in w]
    root = topology.build(config).root
    assert (root.id, root.max_restarts, root.max_seconds) == ("PipelineSupervisor", 4, 10.0)


def test_max_restarts_follows_max_crashes_unless_set() -> None:
    config = validate(with_("processors.default.max_crashes", 5)).config
    assert config.pipeline.max_restarts == 6
    off = validate(with_("processors.default.max_crashes", 0)).config
    assert off.pipeline.max_restarts == 3


def test_an_intensity_below_max_crashes_is_warned_about() -> None:
    raw = with_("processors.default.max_crashes", 5)
    raw["pipeline"]["max_restarts"] = 2
    warnings = validate(raw).warnings
    assert any(w.startswith("pipeline.max_restarts:") and "max_crashes (5)" in w
               for w in warnings), warnings


@pytest.mark.parametrize("path,value,fragment", [
    ("processors.default.max_crashes", -1, "must be 0 or more"),
    ("processors.default.max_crashes", "3", "expected an integer"),
    ("processors.default.max_crashes", True, "got a boolean"),
    ("pipeline.max_restarts", -1, "must be 0 or more"),
    ("pipeline.max_seconds", 0, "must be greater than 0"),
])
def test_bad_values_name_the_key(path: str, value, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate(with_(path, value))
    assert str(err.value).startswith(path) and fragment in str(err.value)
