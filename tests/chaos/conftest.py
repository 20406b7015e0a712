"""The chaos tests share one Spark Connect server per session (started exactly as the
daemon starts its own, see tests/spark/conftest.py), so a daemon restart costs a few
seconds instead of a JVM start; the Spark JVM kill is covered by the long form
(bench/chaos.py) and tests/spark/test_pipeline_spark.py."""

from __future__ import annotations

import pytest

from tests.spark.conftest import spark_server  # noqa: F401  (the session's server fixture)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chaos: SIGKILLs stages and the daemon under load "
                                       "(select with -m chaos)")
