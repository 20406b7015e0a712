"""A write job of the committer's own, held on the server for as long as a test says.

tests/spark/SlowTaskCommit.java is a Spark commit protocol (Spark's own, for files,
with one thing more): a write task about to commit looks for a flag file (its path in
the JVM's system property ``offbroadway.test.slowCommit``); the first task to find it
renames it to ``<flag>.taken`` (so only one task, of one job, is held), sleeps the
milliseconds the file holds, then commits as usual.  It writes ``<flag>.done``:
``slept N ms``, or ``interrupted after N ms`` when the sleep was interrupted (the task
then fails, its rows never committed).  Nothing else changes: the job is the
committer's, with its stamp, its files, its session and its connection.

:func:`build` compiles it with the JDK's ``javac`` against pyspark's jars (a second or
two) and returns the server's extra Spark properties (``[spark] conf``): the jar in
``spark.jars``, ``spark.sql.sources.commitProtocolClass`` naming the class, and the
system property.  Where no ``javac`` is installed (a JRE only), the test skips with
that reason.
"""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CLASS = "SlowTaskCommit"


def build(tmp: Path, flag: Path) -> dict[str, str]:
    """The jar built under ``tmp``; the server's extra properties for a flag at ``flag``."""
    javac = shutil.which("javac")
    if javac is None:
        pytest.skip("javac not installed (a JDK): needed to build the slowed task commit")
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    out = tmp / "slowcommit"
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([javac, "-nowarn", "-cp", f"{jars}/*", "-d", str(out),
                           str(HERE / f"{CLASS}.java")], capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    jar = tmp / "slowcommit.jar"
    with zipfile.ZipFile(jar, "w") as z:
        for f in out.rglob("*.class"):
            z.write(f, f.relative_to(out).as_posix())
    return {"spark.jars": str(jar),
            "spark.sql.sources.commitProtocolClass": CLASS,
            "spark.driver.extraJavaOptions": f"-Doffbroadway.test.slowCommit={flag}"}
