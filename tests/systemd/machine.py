"""A real systemd to run the service under: PID 1 of a ``systemd-nspawn`` container.

The host has no systemd of its own (and no D-Bus), so the container boots Debian
bookworm's systemd 252 with ``--keep-unit --register=no`` (without them nspawn asks the
host's bus and fails with "Failed to open system bus").  Commands run inside through
``nsenter -t <container PID 1> -a`` with a clean environment.

The root file system comes from ``debootstrap --variant=minbase`` with systemd, dbus,
python3-venv and a Java 17 runtime for the local Spark child (about 60 s and 590 MB); the
tarball is cached under ``/var/cache/offbroadway-tests`` keyed by suite and package list,
so only the first run on a machine pays for it, and every boot unpacks a fresh copy
(about 3 s).

pip inside the container does not trust the host's package index certificate, so the
host builds the wheels (offbroadway's own from this clone, and its dependencies, cached
by pip) into a directory the container sees read-only at ``/wheels``; inside, pip
installs with ``--no-index --find-links /wheels``: the same install docs/operations.md
gives, minus the network.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from tests.conftest import REPO, wait_until

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("systemd", "systemd-sysv", "dbus", "python3", "python3-venv", "python3-pip",
            "openjdk-17-jre-headless")
CACHE = Path(os.environ.get("OFFBROADWAY_TEST_CACHE", "/var/cache/offbroadway-tests"))
#: the host tools this needs (CI installs them: .ci/run)
TOOLS = ("debootstrap", "systemd-nspawn", "nsenter")
INSIDE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
              "HOME": "/root", "LANG": "C.UTF-8", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"}


def missing_tools() -> list[str]:
    out = [t for t in TOOLS if shutil.which(t) is None]
    if os.geteuid() != 0:
        out.append("root")
    return out


def rootfs_tarball() -> Path:
    """The cached root file system, built once per package list."""
    key = hashlib.sha256(f"{SUITE} minbase {','.join(PACKAGES)}".encode()).hexdigest()[:12]
    tarball = CACHE / f"rootfs-{SUITE}-{key}.tar"
    if tarball.exists():
        return tarball
    CACHE.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix="rootfs-", dir=CACHE))
    try:
        subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
                        SUITE, str(build), MIRROR], check=True, capture_output=True,
                       timeout=900)
        build.chmod(0o755)     # mkdtemp made it 0700, and tar records "." with that mode
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(build), "-cf", str(partial), "."], check=True)
        partial.rename(tarball)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return tarball


def build_wheels(wheels: Path) -> Path:
    """offbroadway's wheel from this clone plus its dependencies', for pip inside (pip's
    own cache makes the dependencies a copy after the first run)."""
    wheels.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "-w", str(wheels),
                    f"{REPO}[spark]"], check=True, capture_output=True, timeout=900)
    return wheels


class Machine:
    """A booted container; :meth:`sh` runs a shell command inside as root."""

    def __init__(self, root: Path, wheels: Path) -> None:
        self.root = root
        self.wheels = wheels
        self.name = f"ob{os.getpid()}"
        self.log = root.parent / "console.log"
        self.proc: subprocess.Popen | None = None
        self.leader = 0

    def boot(self, timeout: float = 120) -> None:
        with open(self.log, "w") as console:
            self.proc = subprocess.Popen(
                ["systemd-nspawn", "--boot", "--quiet", f"--directory={self.root}",
                 "--keep-unit", "--register=no", f"--machine={self.name}",
                 "--console=passive", f"--bind-ro={self.wheels}:/wheels"],
                stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT)

        def leader() -> int:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                try:
                    if child.name() == "systemd":
                        return child.pid
                except psutil.Error:
                    pass
            return 0

        self.leader = wait_until(leader, timeout=30, interval=0.1, message="container PID 1")

        def booted() -> bool:
            out = self.sh("systemctl is-system-running", check=False).stdout.strip()
            return out in ("running", "degraded")

        wait_until(booted, timeout=timeout, interval=0.2, message="the container's systemd")

    def sh(self, command: str, *, check: bool = True, timeout: float = 300,
           input: str | None = None) -> subprocess.CompletedProcess:
        out = subprocess.run(["nsenter", "-t", str(self.leader), "-a", "env", "-i",
                              *[f"{k}={v}" for k, v in INSIDE_ENV.items()],
                              "sh", "-c", command], capture_output=True, text=True,
                             timeout=timeout, input=input)
        if check and out.returncode != 0:
            raise AssertionError(f"inside the container: {command!r} exited "
                                 f"{out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        return out

    def write(self, path: str, text: str, mode: int = 0o644) -> None:
        target = self.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        os.chmod(target, mode)

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.sh(f"systemctl show {unit} " + " ".join(f"-p {p}" for p in props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def shutdown(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()          # nspawn asks the container's systemd to power off
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def boot_machine(workdir: Path) -> Machine:
    tarball = rootfs_tarball()
    wheels = build_wheels(workdir / "wheels")
    root = workdir / "rootfs"
    root.mkdir()
    subprocess.run(["tar", "-C", str(root), "-xf", str(tarball)], check=True)
    # the container's "/": a tarball cached by an earlier version recorded it 0700, and
    # then no user but root can resolve a path inside (dbus-daemon's inotify, the service's
    # WorkingDirectory and its journal socket all fail with EACCES; the boot never ends)
    root.chmod(0o755)
    machine = Machine(root, wheels)
    started = time.monotonic()
    machine.boot()
    machine.boot_seconds = time.monotonic() - started  # type: ignore[attr-defined]
    return machine
