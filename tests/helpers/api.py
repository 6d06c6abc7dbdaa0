"""The API service as it runs on a login host: `nodeagent api` in its own process, as its own
Unix user (the account the pool's agents name in pool.api_users), on a Unix socket and on an
HTTPS address with a self-signed certificate."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nodeagent.api.server import answers
from tests.helpers.cluster import free_port, wait_for
from tests.helpers.pool import PoolCluster, pool_cluster
from tests.helpers.rediscluster import Certificate, self_signed
from tests.helpers.users import User


@dataclass
class ApiService:
    url: str
    socket: str
    certificate: Certificate
    log: Path
    command: list[str]
    port: int
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it and wait until both its socket and its address accept connections."""
        with self.log.open("ab") as out:
            proc = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT, cwd="/")
        self.proc = proc
        wait_for(
            lambda: proc.poll() is not None or (_port_answers(self.port) and answers(self.socket)),
            30,
            "the API service to listen",
        )
        assert proc.poll() is None, self.log.read_text()

    def crash(self) -> None:
        """SIGKILL, as the OOM killer or a power cut would: no clean-up of its own (its socket
        file stays behind)."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _port_answers(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def api_service(
    directory: Path,
    redis_url: str,
    pool: str,
    munge_socket: str,
    user: User,
    limits: dict[str, object] | None = None,
    accounting: str = "",
) -> Iterator[ApiService]:
    """`directory` must be reachable by `user` (its files are made readable to it)."""
    run_dir = directory / "run"
    run_dir.mkdir(exist_ok=True)
    os.chown(run_dir, user.uid, user.gid)
    certificate = self_signed(directory)
    for path in (certificate.cert, certificate.key):
        os.chown(path, user.uid, user.gid)
    port = free_port()
    config = {
        "redis": {"url": redis_url},
        "pool": pool,
        "munge_socket": munge_socket,
        "socket": str(run_dir / "api.sock"),
        "socket_mode": "0666",
        "listen": f"127.0.0.1:{port}",
        "tls": {"cert": str(certificate.cert), "key": str(certificate.key)},
        "limits": limits or {},
        "accounting": {"database": accounting},
    }
    path = directory / "api.yaml"
    path.write_text(yaml.safe_dump(config))
    caps = ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]  # the checkout
    command = ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups", *caps]
    service = ApiService(
        url=f"https://127.0.0.1:{port}",
        socket=str(run_dir / "api.sock"),
        certificate=certificate,
        log=directory / "api.log",
        command=[*command, sys.executable, "-m", "nodeagent", "api", "--config", str(path)],
        port=port,
    )
    try:
        service.start()
        yield service
    finally:
        service.stop()


def token_key(path: Path) -> Path:
    """A pool's token key (pool.tokens.key_file), readable by root alone."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(os.urandom(32).hex() + "\n")
    return path


@contextmanager
def token_pool(
    redis_url: str,
    shared: Path,
    munge_socket: str,
    users: dict[str, User],
    key: Path,
    pool: str,
    node_options: dict[str, Any] | None = None,
) -> Iterator[PoolCluster]:
    """Two agents (a, b) of a pool that takes signed requests and tokens made with `key`:
    users alice and bob submit; apisvc is its pool.api_users (the API service's account).
    `node_options`: more config sections, the same on both nodes."""
    scheduling: dict[str, object] = {
        "auth": "munge",
        "munge_socket": munge_socket,
        "users": [users["alice"].name, users["bob"].name],
        "tokens": {"key_file": str(key), "max_lifetime": "1h"},
        "api_users": [users["apisvc"].name],
    }
    state = shared / "state"  # as systemd's StateDirectory= makes /var/lib/nodeagent: 0755
    state.mkdir(exist_ok=True)
    state.chmod(0o755)
    with pool_cluster(redis_url, shared, pool=pool, scheduling=scheduling) as cluster:
        cluster.node_options.update(dict.fromkeys("ab", node_options or {}))
        cluster.start("a", "b")
        cluster.wait_nodes(2)
        yield cluster


@contextmanager
def api_beside(
    pool: PoolCluster, shared: Path, munge_socket: str, user: User
) -> Iterator[ApiService]:
    """`nodeagent api` for `pool`, as `user`, its files in `shared`/api; it reads the pool's
    accounting database, the default file its agents write (docs/accounting.md)."""
    directory = shared / "api"
    directory.mkdir()
    directory.chmod(0o755)
    accounting = f"sqlite://{pool.directory / 'state' / 'accounting.sqlite'}"
    with api_service(
        directory, pool.redis_url, pool.pool, munge_socket, user, accounting=accounting
    ) as service:
        yield service
