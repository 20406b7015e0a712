"""TLS to a remote Spark Connect (``[spark] use_ssl``, ``ca_file``).

The server runs in a network namespace of its own behind a TLS front (tls_relay.py, a
certificate for 10.77.0.2 made by the test and signed by nobody: only ``ca_file`` makes
it trusted); the daemon, in another namespace, reaches it over the veth pair at
``sc://10.77.0.2:15002`` with a token.  Every spool line lands once.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, offbroadway_cmd
from tests.e2e.test_pipeline import make_config, write_spool
from tests.spark.conftest import start_server
from tests.spark.netns import PORT, SRV_ADDR, link
from tests.spark.test_pipeline_spark import (
    TOKEN_ENV,
    assert_each_message_exactly_once,
    daemon_env,
    rows,
    spark_section,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
SERVER_PORT = 15003


def certificate(where: Path) -> tuple[Path, Path]:
    """A self-signed certificate for the server's address on the link."""
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=spark-test",
                    "-addext", f"subjectAltName=IP:{SRV_ADDR}"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


@pytest.fixture
def net(short_tmp: Path):
    yield from link(short_tmp)


def test_rows_land_through_tls_with_a_private_ca(short_tmp: Path, net) -> None:
    server = start_server(short_tmp / "srv", wrap=net.exec(net.srv, []),
                          port=SERVER_PORT)
    relay = None
    try:
        cert, key = certificate(short_tmp)
        relay = subprocess.Popen(net.exec(net.srv, [
            sys.executable, str(HERE / "tls_relay.py"), SRV_ADDR, str(PORT), str(cert),
            str(key), str(SERVER_PORT)]), stdout=subprocess.PIPE, text=True)
        assert relay.stdout.readline().strip() == "listening"
        n = 3000
        write_spool(short_tmp / "spool", n, files=1, extra={"route": "even"})
        config = make_config(short_tmp, batchers={
            "even": {"batch_size": 500, "batch_timeout": 0.5}})
        config.write_text(config.read_text() + spark_section(
            short_tmp / "dataset", remote=f"sc://{SRV_ADDR}:{PORT}",
            token_env=TOKEN_ENV, ca_file=str(cert), commit_rows=1000,
            commit_interval=0.5))
        proc = subprocess.run(net.exec(net.cli, offbroadway_cmd(
            "run", str(config), "--until-idle")), cwd=REPO, env=daemon_env(server),
            capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert_each_message_exactly_once(rows(short_tmp / "dataset", "even"), n)
        assert server.token not in proc.stdout + proc.stderr
        # and the CA file is what made the server trusted: without it, the bundled roots
        # refuse its certificate
        script = ("from offbroadway.stages.spark.spark_sink import SparkSink, CommitFailed\n"
                  f"s = SparkSink(remote='sc://{SRV_ADDR}:{PORT}', output='/nonexistent', "
                  f"writer_id='x', token_env='{TOKEN_ENV}', use_ssl=True, "
                  "write_retry_seconds=0)\n"
                  "try:\n    s.existing_schema('even')\n    print('trusted')\n"
                  "except CommitFailed as exc:\n    print(exc.reason)\n")
        out = subprocess.run(net.exec(net.cli, [sys.executable, "-c", script]), cwd=REPO,
                             env=daemon_env(server), capture_output=True, text=True,
                             timeout=120).stdout
        assert "trusted" not in out and out.strip(), out
        print("\nwithout ca_file: " + out.strip())
    finally:
        if relay is not None:
            relay.kill()
            relay.wait()
        server.stop()
