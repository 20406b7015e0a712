"""What the package ships: ``python -m offbroadway`` is the ``offbroadway`` command, and the
type hints are declared (PEP 561 ``py.typed``) in what setuptools builds from setup.cfg."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, test_env


def test_python_m_offbroadway_is_the_command() -> None:
    version = subprocess.run([sys.executable, "-m", "offbroadway", "--version"], cwd="/",
                             env=test_env(), capture_output=True, text=True, timeout=60)
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("offbroadway ")
    check = subprocess.run([sys.executable, "-m", "offbroadway", "check", "/nonexistent.toml"],
                           cwd="/", env=test_env(), capture_output=True, text=True, timeout=60)
    assert check.returncode == 2 and "cannot read config /nonexistent.toml" in check.stderr


def test_the_built_package_declares_its_type_hints(tmp_path: Path) -> None:
    build = subprocess.run([sys.executable, "-c", "import setuptools; setuptools.setup()",
                            "-q", "build_py", "-d", str(tmp_path)], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    assert (tmp_path / "offbroadway" / "py.typed").is_file()
    assert (tmp_path / "offbroadway" / "__main__.py").is_file()
