"""One booted systemd for the whole directory, with offbroadway installed in it the way
docs/operations.md tells an operator to (see :mod:`tests.systemd.machine`)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.systemd.machine import Machine, boot_machine, missing_tools

#: the directory docs/operations.md puts handler modules in (on the unit's PYTHONPATH)
HANDLERS = "/etc/offbroadway/handlers"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.systemd)


def install(machine: Machine) -> None:
    """docs/operations.md's "Install as a service", step by step (wheel from this clone)."""
    wheel = next(machine.wheels.glob("offbroadway-*.whl")).name
    machine.sh("useradd --system --home-dir /var/lib/offbroadway --shell /usr/sbin/nologin "
               "offbroadway")
    machine.sh("python3 -m venv /opt/offbroadway")
    machine.sh("/opt/offbroadway/bin/pip install -q --no-index --find-links /wheels "
               f"'/wheels/{wheel}[spark]'", timeout=600)
    machine.sh(f"install -d -m 0755 /etc/offbroadway {HANDLERS}")
    for src in ("examples/__init__.py", "examples/orders.py"):
        machine.write(f"{HANDLERS}/{src}", (REPO / src).read_text())
    machine.write(f"{HANDLERS}/svc_handler.py",
                  (Path(__file__).parent / "svc_handler.py").read_text())
    machine.sh("cp /opt/offbroadway/share/doc/offbroadway/offbroadway@.service "
               "/etc/systemd/system/ && systemctl daemon-reload")


@pytest.fixture(scope="package")
def machine():
    missing = missing_tools()
    if missing:
        if os.environ.get("OFFBROADWAY_REQUIRE_CI_TOOLS"):
            pytest.fail(f"the systemd suite needs {', '.join(missing)} (CI installs them)")
        pytest.skip(f"needs {', '.join(missing)}; run .ci/run or see tests/systemd/machine.py")
    workdir = Path(tempfile.mkdtemp(prefix="ob-systemd-", dir="/var/tmp"))
    m = boot_machine(workdir)
    try:
        install(m)
        yield m
    finally:
        m.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)
