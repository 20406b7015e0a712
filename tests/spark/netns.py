"""A real network between the daemon and Spark, to break: two network namespaces.

The Spark Connect server runs in a namespace of its own (``srv``), the daemon in another
(``cli``), joined by a veth pair with addresses only inside them (10.77.0.1 and
10.77.0.2; the namespaces are private, so every test can use the same); faults come from
the kernel's own tools on the link: ``ip link set down``/``up`` on the client's end (a
partition); ``tc`` on both ends, so both directions pass it (``netem`` delay and loss
where the kernel has it; ``tbf``: a slow link that drops what would queue too long);
``nft`` on both ends (:meth:`Link.loss`: a share of the packets lost at random each way,
``numgen random mod 100 < N drop`` as they arrive, so no sender's stack learns of it;
:meth:`Link.cut`: one process's connections to Spark alone, their packets dropped the
same way, so the server never sees them close while every other connection passes).
The machine's own network is not touched: the qdiscs and the nftables tables live in
the namespaces.

Two ``socat`` relays stand where a cluster's address and a broker's would be:

* in ``srv``, ``10.77.0.2:15002`` → the server's gRPC port on that namespace's loopback
  (the server binds 127.0.0.1 whatever its namespace: daemon/spark/server.py);
* in ``cli``, ``localhost:15002`` → ``10.77.0.2:15002``: pyspark speaks plaintext with a
  token only to the literal host ``localhost`` (any other host means TLS);
* in ``cli``, ``127.0.0.1:5672`` → a unix socket → the machine's RabbitMQ (unix sockets
  cross network namespaces): the source is not behind the link being broken.

Needs root (CI runs as root); otherwise the tests skip with the reason, or fail with it
where ``OFFBROADWAY_REQUIRE_CI_TOOLS`` is set; the same for ``nft`` (nftables) where a
test drops packets.  A kernel without a fault's module (``sch_netem``, ``nf_tables``) is
not a missing tool: that case skips with the kernel's answer.  This machine's kernel has
``tbf`` and nftables but no ``netem`` (nor ``fq``/``sfq``): loss and a slow link run here,
delay itself does not.  Measured (tests/brokers/test_spark_network.py, a minute of
``tbf`` 1 Mbit/s with 5 % loss each way): 17 of 371 and 22 of 392 packets lost, 86-92
commits in the minute against 93 on ``tbf`` alone, every id once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SRV_ADDR, CLI_ADDR, PORT = "10.77.0.2", "10.77.0.1", 15002


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def cannot_make_namespaces() -> str | None:
    """Why this machine cannot make the namespaces (None: it can)."""
    missing = [t for t in ("ip", "tc", "socat") if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not installed (iproute2, socat)"
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    probe = f"obprobe-{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"`ip netns add` failed: {exc.stderr.strip()}"
    _ip("netns", "del", probe)
    return None


def require_namespaces() -> None:
    reason = cannot_make_namespaces()
    if reason is None:
        return
    if os.environ.get("OFFBROADWAY_REQUIRE_CI_TOOLS"):
        pytest.fail(f"cannot make network namespaces: {reason}")
    pytest.skip(f"cannot make network namespaces: {reason}")


LOSS_TABLE = "obloss"
CUT_TABLE = "obcut"


@dataclass
class Link:
    """The two namespaces, their veth pair and the relays."""

    dir: Path
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def srv(self) -> str:
        return f"obsrv-{self.tag}"

    @property
    def cli(self) -> str:
        return f"obcli-{self.tag}"

    @property
    def dev(self) -> str:
        """The client's end of the link (``tc`` and ``link set`` act here)."""
        return f"obc{self.tag}"

    @property
    def remote(self) -> str:
        return f"sc://localhost:{PORT}"

    def exec(self, ns: str, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", ns, *argv]

    def create(self) -> None:
        peer = f"obs{self.tag}"
        _ip("netns", "add", self.srv)
        _ip("netns", "add", self.cli)
        _ip("link", "add", self.dev, "netns", self.cli, "type", "veth", "peer", "name", peer,
            "netns", self.srv)
        for ns, dev, addr in ((self.cli, self.dev, CLI_ADDR), (self.srv, peer, SRV_ADDR)):
            _ip("-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def relay(self, ns: str | None, listen: str, to: str) -> None:
        argv = ["socat", listen, to]
        self.procs.append(subprocess.Popen(self.exec(ns, argv) if ns else argv,
                                           stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL))

    def relay_spark(self, server_port: int) -> None:
        self.relay(self.srv, f"TCP-LISTEN:{PORT},bind={SRV_ADDR},fork,reuseaddr",
                   f"TCP:127.0.0.1:{server_port}")
        self.relay(self.cli, f"TCP-LISTEN:{PORT},bind=127.0.0.1,fork,reuseaddr",
                   f"TCP:{SRV_ADDR}:{PORT}")

    def relay_rabbitmq(self) -> None:
        sock = self.dir / "amqp.sock"
        self.relay(None, f"UNIX-LISTEN:{sock},fork,unlink-early", "TCP:127.0.0.1:5672")
        self.relay(self.cli, "TCP-LISTEN:5672,bind=127.0.0.1,fork,reuseaddr",
                   f"UNIX-CONNECT:{sock}")

    # -- faults ----------------------------------------------------------------------------
    def down(self) -> None:
        _ip("-n", self.cli, "link", "set", self.dev, "down")

    def up(self) -> None:
        _ip("-n", self.cli, "link", "set", self.dev, "up")

    def qdisc(self, *spec: str) -> None:
        """``tc qdisc replace … root <spec>`` on both ends of the link, so both directions
        pass it (``netem delay 200ms loss 5%``: 400 ms a round trip; ``tbf rate 1mbit
        burst 32kbit latency 50ms``: a slow link that drops what would queue longer)."""
        for ns, dev in ((self.cli, self.dev), (self.srv, f"obs{self.tag}")):
            subprocess.run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", *spec],
                           check=True, capture_output=True, timeout=30)

    def can(self, *spec: str) -> str | None:
        """Why this kernel cannot apply ``spec`` (None: it can): tried on a dummy end."""
        out = subprocess.run(["tc", "-n", self.srv, "qdisc", "replace", "dev", "lo", "root",
                              *spec], capture_output=True, text=True, timeout=30)
        subprocess.run(["tc", "-n", self.srv, "qdisc", "del", "dev", "lo", "root"],
                       capture_output=True, timeout=30)
        return None if out.returncode == 0 else \
            f"tc qdisc {spec[0]}: {out.stderr.strip()} (this kernel lacks sch_{spec[0]})"

    def _nft(self, ns: str, *script: str) -> subprocess.CompletedProcess:
        """``nft -f -`` in ``ns`` with ``script``'s lines (one transaction)."""
        return subprocess.run(self.exec(ns, ["nft", "-f", "-"]), input="\n".join(script) + "\n",
                              capture_output=True, text=True, timeout=30)

    @staticmethod
    def _loss_rules(dev: str, percent: int) -> list[str]:
        return [f"table netdev {LOSS_TABLE} {{",
                f'  chain in {{ type filter hook ingress device "{dev}" priority 0;',
                "    counter",
                f"    numgen random mod 100 < {percent} counter drop",
                "  }",
                "}"]

    def loss(self, percent: int) -> None:
        """Lose ``percent`` % of the packets each way, at random, each on its own (as
        ``netem loss`` does): an nftables ``netdev`` table on each end of the link drops
        them as they arrive, so the sender's stack never learns of it, as on a wire (a
        drop on the way out, ``output`` hook or qdisc, is reported to the sender, whose
        TCP sends the segment again at once; UDP gets EPERM).  :meth:`clear` takes it
        away."""
        for ns, dev in ((self.cli, self.dev), (self.srv, f"obs{self.tag}")):
            out = self._nft(ns, *self._loss_rules(dev, percent))
            if out.returncode != 0:
                raise RuntimeError(f"nft in {ns}: {out.stderr.strip()}")

    def _established(self) -> list[tuple[str, str, set[int]]]:
        """The client namespace's established TCP connections: (local, peer, pids)."""
        import re

        out = subprocess.run(self.exec(self.cli, ["ss", "-tnpH", "state", "established"]),
                             capture_output=True, text=True, timeout=30, check=True)
        found = []
        for line in out.stdout.splitlines():
            cols = line.split()
            if len(cols) < 4:
                continue
            # an IPv4 connection of a dual-stack socket: [::ffff:127.0.0.1]:52502
            local, peer = (re.sub(r"^\[::ffff:([\d.]+)\]", r"\1", c) for c in cols[2:4])
            found.append((local, peer, {int(p) for p in re.findall(r"pid=(\d+)", line)}))
        return found

    def cut(self, pid: int) -> list[int]:
        """Partition the connections of process ``pid`` (in the client namespace) to
        Spark, and only those: their packets dropped as they arrive at either end of the
        link, so neither side's stack learns of it and the server never sees them close,
        while every other connection, and every new one, passes.  Each goes through the
        client's relay, whose child for it holds a connection of its own over the link;
        that one's port (the client's end) names it in an nftables table on each end
        (``tcp sport``/``dport``).  Returns those ports; counted by :meth:`cut_counted`."""
        conns = self._established()
        mine = {local.rpartition(":")[2] for local, peer, pids in conns
                if pid in pids and peer == f"127.0.0.1:{PORT}"}
        relays = {p for local, peer, pids in conns
                  if local == f"127.0.0.1:{PORT}" and peer.rpartition(":")[2] in mine
                  for p in pids}
        ports = sorted(int(local.rpartition(":")[2]) for local, peer, pids in conns
                       if pids & relays and peer == f"{SRV_ADDR}:{PORT}")
        if not ports:
            raise RuntimeError(f"no connection of pid {pid} to Spark found: {conns}")
        listed = ", ".join(map(str, ports))
        for ns, dev, match in ((self.srv, f"obs{self.tag}", "sport"),
                               (self.cli, self.dev, "dport")):
            out = self._nft(ns, f"table netdev {CUT_TABLE} {{",
                            f'  chain in {{ type filter hook ingress device "{dev}" '
                            "priority -1;",
                            f"    tcp {match} {{ {listed} }} counter drop",
                            "  }", "}")
            if out.returncode != 0:
                raise RuntimeError(f"nft in {ns}: {out.stderr.strip()}")
        return ports

    def cut_counted(self) -> int:
        """Packets of the cut connections dropped so far, both ends summed."""
        import json

        dropped = 0
        for ns in (self.cli, self.srv):
            out = subprocess.run(self.exec(ns, ["nft", "-j", "list", "table", "netdev",
                                                CUT_TABLE]),
                                 capture_output=True, text=True, timeout=30)
            if out.returncode != 0:
                continue
            for item in json.loads(out.stdout)["nftables"]:
                for e in item.get("rule", {}).get("expr", []):
                    if "counter" in e:
                        dropped += e["counter"]["packets"]
        return dropped

    def counted(self) -> dict[str, int]:
        """What the faults have done so far, both ends summed: ``packets`` arrived at the
        loss tables, ``lost`` there, ``qdisc_sent`` and ``qdisc_dropped`` by the root
        qdiscs (read before :meth:`clear`, which takes them away)."""
        import json

        got = dict.fromkeys(("packets", "lost", "qdisc_sent", "qdisc_dropped"), 0)
        for ns, dev in ((self.cli, self.dev), (self.srv, f"obs{self.tag}")):
            out = subprocess.run(["tc", "-n", ns, "-j", "-s", "qdisc", "show", "dev", dev],
                                 capture_output=True, text=True, timeout=30)
            for q in json.loads(out.stdout or "[]"):
                if q.get("root"):
                    got["qdisc_sent"] += q.get("packets", 0)
                    got["qdisc_dropped"] += q.get("drops", 0)
            if shutil.which("nft") is None:
                continue
            out = subprocess.run(self.exec(ns, ["nft", "-j", "list", "table", "netdev",
                                                LOSS_TABLE]),
                                 capture_output=True, text=True, timeout=30)
            rules = [item["rule"] for item in
                     (json.loads(out.stdout)["nftables"] if out.returncode == 0 else [])
                     if "rule" in item]
            counters = [e["counter"]["packets"] for r in rules for e in r["expr"]
                        if "counter" in e]
            if len(counters) == 2:
                got["packets"] += counters[0]
                got["lost"] += counters[1]
        return got

    def cannot_drop(self) -> str | None:
        """Why :meth:`loss` cannot run here (None: it can): ``nft`` missing, or the kernel
        refusing the table (tried on the server namespace's loopback, dropping 0 %)."""
        if shutil.which("nft") is None:
            return "nft not installed (nftables)"
        out = self._nft(self.srv, *self._loss_rules("lo", 0))   # drops nothing
        self._nft(self.srv, f"delete table netdev {LOSS_TABLE}")
        return None if out.returncode == 0 else \
            f"nft: {out.stderr.strip()} (this kernel lacks nf_tables or its numgen)"

    def require_drop(self) -> None:
        """Skip (fail where ``OFFBROADWAY_REQUIRE_CI_TOOLS`` says the tools must be
        there and ``nft`` is not) unless :meth:`loss` can run."""
        why = self.cannot_drop()
        if why is None:
            return
        if shutil.which("nft") is None and os.environ.get("OFFBROADWAY_REQUIRE_CI_TOOLS"):
            pytest.fail(f"cannot drop packets: {why}")
        pytest.skip(f"cannot drop packets: {why}")

    def clear(self) -> None:
        """Every fault off: the qdiscs on both ends, the loss table."""
        for ns, dev in ((self.cli, self.dev), (self.srv, f"obs{self.tag}")):
            subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"],
                           capture_output=True, timeout=30)
        if shutil.which("nft") is not None:
            for ns in (self.cli, self.srv):
                self._nft(ns, f"delete table netdev {LOSS_TABLE}")

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for ns in (self.cli, self.srv):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def link(tmp: Path) -> Iterator[Link]:
    require_namespaces()
    made = Link(tmp)
    try:
        made.create()
        yield made
    finally:
        made.close()
