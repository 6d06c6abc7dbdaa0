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

from nodeagent.api.server import answers
from tests.helpers.cluster import free_port, wait_for
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
