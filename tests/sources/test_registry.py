"""The source registry: names resolve lazily, unknown names fail with the list of known ones."""

from __future__ import annotations

import subprocess
import sys

import pytest
from offbroadway.stages.sources import (
    Source,
    SourceOptionError,
    UnknownSourceError,
    get_source,
    known_sources,
)
from offbroadway.stages.sources.generator import GeneratorSource
from offbroadway.stages.sources.spool import SpoolSource


def test_builtin_names_resolve() -> None:
    assert get_source("generator") is GeneratorSource
    assert get_source("spool") is SpoolSource
    assert {"generator", "spool", "rabbitmq", "redis"} <= set(known_sources())


def test_unknown_name_lists_known_ones() -> None:
    with pytest.raises(UnknownSourceError) as err:
        get_source("kafkaa")
    msg = str(err.value)
    assert "'kafkaa'" in msg
    for name in ("generator", "spool", "rabbitmq", "redis"):
        assert name in msg
    assert isinstance(err.value, ValueError)


def test_module_class_path_loads_a_user_source() -> None:
    assert get_source("offbroadway.stages.sources.generator:GeneratorSource") is GeneratorSource
    with pytest.raises(UnknownSourceError, match="not a subclass"):
        get_source("offbroadway.stages.sources.base:check_known_options")
    with pytest.raises(ImportError, match="no_such_module"):
        get_source("no_such_module:Thing")


def test_sources_are_imported_only_when_asked_for() -> None:
    """Importing the registry, or loading the spool, must not import broker clients."""
    code = (
        "import sys\n"
        "import offbroadway.stages.sources as s\n"
        "assert 'offbroadway.stages.sources.spool' not in sys.modules\n"
        "s.get_source('spool')\n"
        "bad = [m for m in ('pika', 'redis', 'offbroadway.stages.sources.generator',"
        " 'offbroadway.stages.sources.rabbitmq') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)


def test_base_rejects_bad_producer_placement() -> None:
    with pytest.raises(ValueError, match="producer_index"):
        GeneratorSource({}, producer_index=2, producer_count=2)


def test_option_errors_name_the_option() -> None:
    with pytest.raises(SourceOptionError, match="'cont'") as err:
        GeneratorSource({"cont": 5})
    assert err.value.option == "cont"
    assert issubclass(SourceOptionError, ValueError)
    assert issubclass(GeneratorSource, Source)


@pytest.mark.parametrize("name", known_sources())
def test_every_registered_name_resolves(name: str) -> None:
    """A registry entry pointing at a renamed module or class fails here, not in production."""
    try:
        cls = get_source(name)
    except ImportError as exc:
        if "pika" in str(exc) or "redis" in str(exc):
            pytest.skip(f"client library missing: {exc}")
        raise
    assert issubclass(cls, Source) and cls.name == name
