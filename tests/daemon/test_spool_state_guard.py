"""A spool source pointed at ``<state_dir>/spool`` is refused by check (and run): it would
read its own dead-letter.jsonl back as input (seen under systemd, tests/systemd)."""

from __future__ import annotations

from pathlib import Path

import pytest
from offbroadway.daemon.config.checks import preflight
from offbroadway.daemon.config.load import ConfigError, load_config


def config(tmp: Path, spool: str) -> Path:
    path = tmp / "c.toml"
    path.write_text(f"""
[pipeline]
name = "g"
handler = "tests.e2e.handlers:Recorder"

[producer]
source = "spool"

[producer.options]
path = "{spool}"

[metrics]
listen = ""

[runtime]
dir = "{tmp / 'run'}"
state_dir = "{tmp / 'state'}"
""")
    return path


def test_the_spools_own_state_dir_is_refused_as_input(tmp_path: Path) -> None:
    (tmp_path / "state" / "spool").mkdir(parents=True)
    loaded = load_config(str(config(tmp_path, str(tmp_path / "state" / "spool"))))
    with pytest.raises(ConfigError, match=r"producer\.options\.path: .*dead-letter\.jsonl"):
        preflight(loaded.config)


def test_a_directory_beside_it_is_fine(tmp_path: Path) -> None:
    (tmp_path / "state" / "incoming").mkdir(parents=True)
    loaded = load_config(str(config(tmp_path, str(tmp_path / "state" / "incoming"))))
    preflight(loaded.config)
