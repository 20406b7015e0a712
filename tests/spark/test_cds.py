"""The Spark server's class-data-sharing archive: recorded at a start, built in the
background, mapped by the next start (daemon/spark/server.py's ``Cds``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from offbroadway.daemon.spark.jvm import SUBMIT_CLASS, Cds, cds_folder, without_conf_dir

from tests.conftest import wait_until
from tests.spark.conftest import start_server

JARS = "/opt/spark/jars/*"


def _cmd(state: str, memory: str = "1g", cp: str = JARS) -> list[str]:
    """A launcher command as Spark's launcher prints it, for a state dir."""
    return ["/usr/bin/java", "-cp", f"{state}/conf/:{cp}", f"-Xmx{memory}",
            f"-Djava.io.tmpdir={state}/tmp", "-XX:+IgnoreUnrecognizedVMOptions",
            "--add-modules=jdk.incubator.vector", SUBMIT_CLASS, "--master", "local[2]"]


def test_the_archive_is_one_per_class_path_not_per_state_dir(tmp_path: Path):
    said: list[str] = []
    one = Cds(tmp_path, without_conf_dir(_cmd("/s1"), Path("/s1/conf")), said.append)
    two = Cds(tmp_path, without_conf_dir(_cmd("/s2", "2g"), Path("/s2/conf")), said.append)
    other = Cds(tmp_path, without_conf_dir(_cmd("/s1", cp="/x/*"), Path("/s1/conf")),
                said.append)
    assert one.archive == two.archive != other.archive
    assert "-cp" in one.jvm_options and "/s1/conf" not in " ".join(one.jvm_options)
    assert "--add-modules=jdk.incubator.vector" in one.jvm_options
    assert not any(o.startswith(("-Xmx", "-D")) for o in one.jvm_options)


def test_a_start_records_then_maps(tmp_path: Path):
    cds = Cds(tmp_path, _cmd("/s"), lambda _text: None)
    assert cds.options() == [f"-XX:DumpLoadedClassList={cds.recording}"]
    cds.classes.write_text("java/lang/Object\n")
    assert cds.options() == []            # a list and no archive: the dump makes it
    cds.archive.write_bytes(b"x")
    assert cds.options() == [f"-XX:SharedArchiveFile={cds.archive}"]


def test_the_cache_folder_follows_xdg_and_systemd(tmp_path: Path):
    assert cds_folder({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "offbroadway" / "spark-cds"
    assert cds_folder({"CACHE_DIRECTORY": "/var/cache/ob", "XDG_CACHE_HOME": "/x"}) == \
        Path("/var/cache/ob/spark-cds")


def test_an_unwritable_cache_means_no_archive_and_no_error(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert Cds(blocker / "cds", _cmd("/s"), lambda _text: None).options() == []


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


# two JVM starts and a dump (a JVM's start of CPU): long, not in the default run
@pytest.mark.slow
def test_the_first_start_makes_the_archive_and_the_next_start_maps_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "offbroadway" / "spark-cds"
    first = start_server(tmp_path / "one")
    try:
        assert "-XX:DumpLoadedClassList=" in " ".join(
            Path(f"/proc/{first.jvm_pid()}/cmdline").read_text().split("\0"))
        wait_until(lambda: "archive made" in first.out.read_text(), timeout=300,
                   message="the class-data-sharing archive made in the background")
    finally:
        assert first.stop() == 0
    archives = list(folder.glob("*.jsa"))
    assert len(archives) == 1 and archives[0].stat().st_size > 0
    assert not list(folder.glob("*.partial")) and not list(folder.glob("*.recording"))
    second = start_server(tmp_path / "two")
    try:
        assert str(archives[0]) in _maps(second.jvm_pid())   # the JVM mapped it
        assert "making the class-data-sharing archive" not in second.out.read_text()
    finally:
        assert second.stop() == 0
    assert os.listdir(folder) and not list(folder.glob("*.partial"))
