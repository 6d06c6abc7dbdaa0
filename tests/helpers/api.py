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

import yaml

from tests.helpers.cluster import free_port, wait_for
from tests.helpers.rediscluster import Certificate, self_signed
from tests.helpers.users import User


@dataclass(frozen=True)
class ApiService:
    url: str
    socket: str
    certificate: Certificate
    log: Path
    proc: subprocess.Popen[bytes]


def _answers(port: int) -> bool:
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
    }
    path = directory / "api.yaml"
    path.write_text(yaml.safe_dump(config))
    log = directory / "api.log"
    caps = ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]  # the checkout
    command = ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups", *caps]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*command, sys.executable, "-m", "nodeagent", "api", "--config", str(path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd="/",
        )
    sock = str(run_dir / "api.sock")
    service = ApiService(f"https://127.0.0.1:{port}", sock, certificate, log, proc)
    try:
        wait_for(
            lambda: proc.poll() is not None or (_answers(port) and Path(service.socket).exists()),
            30,
            "the API service to listen",
        )
        assert proc.poll() is None, log.read_text()
        yield service
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
