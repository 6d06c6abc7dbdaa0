"""Test harness: a real three-node Redis Cluster on free loopback ports, no replicas.

Three `redis-server --cluster-enabled yes` joined with `redis-cli --cluster create`, each in its
own folder under the test's tmp dir; `stop()` ends every server this started, also when the
cluster never formed. With a certificate the nodes speak TLS only, to clients and to each other.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

NODES = 3
BUS_OFFSET = 10_000  # a cluster node's bus listens on its port + 10000
READY = "Ready to accept connections"  # what redis-server logs once it listens on every port


def port_for_later() -> int:
    """A free loopback port, and its bus port, below the kernel's ephemeral range.

    Every node takes one: an ephemeral port (free_port()) may have no room above it for the bus,
    and a client's own socket can take it as its source port before the server binds it (or even
    connect to itself on it, as TCP allows when both ends are the same address), as happens to a
    node that starts after clients already try to reach it.
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(100):
        port = random.randrange(1024, low - BUS_OFFSET)
        if all(_bindable(p) for p in (port, port + BUS_OFFSET)):
            return port
    raise RuntimeError(f"no free port pair below {low}")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class Certificate:
    cert: Path  # also the CA: self-signed
    key: Path


def self_signed(directory: Path) -> Certificate:
    """A certificate for 127.0.0.1, valid for a day (needs openssl)."""
    if shutil.which("openssl") is None:
        raise RuntimeError("openssl is needed to make a test certificate (apt-get install openssl)")
    made = Certificate(directory / "cert.pem", directory / "key.pem")
    command = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    command += ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run(
        [*command, "-keyout", str(made.key), "-out", str(made.cert)],
        check=True,
        capture_output=True,
    )
    return made


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not installed (apt-get install redis-server redis-tools)")
    return path


class RedisClusterServers:
    """Three cluster-enabled redis-servers joined into one cluster, every slot covered."""

    def __init__(
        self, directory: Path, ports: list[int] | None = None, tls: Certificate | None = None
    ) -> None:
        """`ports`: the nodes' ports, known before they start (else free ones at start)."""
        self.directory = directory
        self.tls = tls
        self.server = _binary("redis-server")
        self.cli = _binary("redis-cli")
        self.fixed = ports is not None
        self.ports: list[int] = list(ports or [])
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        """The seed-node URL nodeagent takes: every node, so any one of them is enough."""
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        if self.tls:
            return f"rediss+cluster://{hosts}/?ssl_ca_certs={self.tls.cert}"
        return f"redis+cluster://{hosts}/"

    def options(self) -> dict[str, Any]:
        """What a redis-py client needs to talk to one node."""
        return {"ssl": True, "ssl_ca_certs": str(self.tls.cert)} if self.tls else {}

    def start(self) -> None:
        """Start the servers, create the cluster and wait for cluster_state:ok everywhere.

        Raises:
            RuntimeError: a server did not start or the cluster did not form (after stopping
                whatever was started).
        """
        self.start_nodes()
        self.join()

    def start_nodes(self) -> None:
        """Start the servers, each a cluster of its own that serves no slot yet.

        Raises:
            RuntimeError: a server did not start (after stopping all).
        """
        try:
            self._start_servers()
        except BaseException:
            self.stop()
            raise

    def join(self) -> None:
        """Join the started servers into one cluster and wait for cluster_state:ok everywhere.

        Raises:
            RuntimeError: the cluster did not form (after stopping every server).
        """
        try:
            self._create()
            self._wait_ok()
        except BaseException:
            self.stop()
            raise

    def _start_servers(self) -> None:
        """All at once (each may take a second to answer), each retried on a new port."""
        self.ports = self.ports if self.fixed else [port_for_later() for _ in range(NODES)]
        self.procs = [self._spawn(index, port) for index, port in enumerate(self.ports)]
        for index in range(NODES):
            for _ in range(5):
                if _answers(self.ports[index], self.procs[index], self._log(index), self.options()):
                    break
                _end(self.procs[index])
                self.ports[index] = self.ports[index] if self.fixed else port_for_later()
                self.procs[index] = self._spawn(index, self.ports[index])
            else:
                raise RuntimeError(f"cluster node {index}: redis-server did not start")

    def _log(self, index: int) -> Path:
        return self.directory / f"cluster-{index}" / "redis.log"

    def _spawn(self, index: int, port: int) -> subprocess.Popen[bytes]:
        folder = self.directory / f"cluster-{index}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "nodes.conf").unlink(missing_ok=True)  # a node id from a failed start
        self._log(index).unlink(missing_ok=True)  # the log of a failed start
        if self.tls:
            ports = ["--port", "0", "--tls-port", str(port), "--tls-cluster", "yes"]
            ports += ["--tls-cert-file", str(self.tls.cert), "--tls-key-file", str(self.tls.key)]
            ports += ["--tls-ca-cert-file", str(self.tls.cert), "--tls-auth-clients", "no"]
        else:
            ports = ["--port", str(port)]
        return subprocess.Popen(
            [
                self.server,
                *ports,
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(folder / "nodes.conf"),
                "--cluster-node-timeout",
                "2000",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(folder),
                "--logfile",
                str(self._log(index)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def _create(self) -> None:
        done = subprocess.run(
            [
                self.cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{p}" for p in self.ports),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
                *(["--tls", "--cacert", str(self.tls.cert)] if self.tls else []),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout}{done.stderr}")

    def _wait_ok(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(self.ports)
        while pending and time.monotonic() < deadline:
            pending = [p for p in pending if not _cluster_ok(p, self.options())]
            time.sleep(0.05)
        if pending:
            raise RuntimeError(f"cluster_state is not ok on ports {pending} after {timeout_s}s")

    def stop(self) -> None:
        for proc in self.procs:
            _end(proc)
        self.procs = []


def _answers(port: int, proc: subprocess.Popen[bytes], log: Path, options: dict[str, Any]) -> bool:
    """Whether the server came up and answers PING.

    No connection is tried before the server logs that it is ready: one accepted while it still
    binds its bus port, which can fail, is reset when it exits, and Python's ssl module does not
    close a TLS socket reset before its handshake (an unclosed-socket warning, later, anywhere).
    """
    deadline = time.monotonic() + 30
    while READY not in (log.read_text(errors="replace") if log.exists() else ""):
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    with (
        redis.Redis("127.0.0.1", port, socket_timeout=5, **options) as client,
        contextlib.suppress(redis.RedisError),
    ):
        return bool(client.ping())
    return False


def _cluster_ok(port: int, options: dict[str, Any]) -> bool:
    with redis.Redis(
        "127.0.0.1", port, socket_timeout=2, decode_responses=True, **options
    ) as client:
        try:
            info: dict[str, object] = client.cluster("INFO")
        except redis.RedisError:
            return False
    return info.get("cluster_state") == "ok"


def _end(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextlib.contextmanager
def redis_cluster(directory: Path, tls: Certificate | None = None) -> Iterator[RedisClusterServers]:
    """A started cluster for the `with` block, stopped after it."""
    servers = RedisClusterServers(directory, tls=tls)
    servers.start()
    try:
        yield servers
    finally:
        servers.stop()
