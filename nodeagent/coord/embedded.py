"""A private redis-server for one node (`redis.url: embedded`), like `torchrun --standalone`.

Bound to a unix socket only (no TCP port, nothing to firewall), no persistence, stopped with the
agent. The socket path depends only on the job id and the user, so `nodeagentctl --config`
finds it too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from nodeagent.errors import ConfigError

EMBEDDED = "embedded"


def socket_path(job: str) -> Path:
    return Path(tempfile.gettempdir()) / f"nodeagent-{os.getuid()}" / f"{job}.redis.sock"


def embedded_url(job: str) -> str:
    return f"unix://{socket_path(job)}"


class EmbeddedRedis:
    """Start with `start()`, stop with `stop()`; `url` is what clients connect to."""

    def __init__(self, job: str, binary: str | None = None) -> None:
        self.socket = socket_path(job)
        self.binary = binary or shutil.which("redis-server")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout_s: float = 10.0) -> None:
        """Raises ConfigError if redis-server is missing or does not come up."""
        if not self.binary:
            raise ConfigError(
                "redis.url",
                "'embedded' needs the redis-server binary (Debian: apt-get install "
                "redis-server), or set redis.url to a Redis server",
            )
        self.socket.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        self._proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                "0",
                "--unixsocket",
                str(self.socket),
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.socket.parent),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        client = redis.Redis(unix_socket_path=str(self.socket), socket_timeout=1)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                raise ConfigError(
                    "redis.url", f"embedded redis-server exited: {err.strip()[-300:]}"
                )
            try:
                if client.ping():
                    client.close()
                    return
            except redis.RedisError:
                time.sleep(0.02)
        self.stop()
        raise ConfigError("redis.url", f"embedded redis-server did not answer in {timeout_s:.0f}s")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc is not None and self._proc.stderr is not None:
            self._proc.stderr.close()
        self._proc = None
        self.socket.unlink(missing_ok=True)
