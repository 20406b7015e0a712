"""The chaos tests use the session's Spark Connect server (``spark_server`` in
tests/conftest.py, shared with tests/spark and started exactly as the daemon starts its
own), so a daemon restart costs a few seconds instead of a JVM start; the Spark JVM kill
is covered by the long form (bench/chaos.py) and tests/spark/test_pipeline_spark.py."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chaos: SIGKILLs stages and the daemon under load "
                                       "(select with -m chaos)")
