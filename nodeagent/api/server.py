"""The API service's servers: uvicorn on the Unix socket (callers named by the kernel) and,
where configured, on a network address with the operator's TLS certificate (callers with API
tokens). One process, one event loop; SIGTERM or SIGINT stops both, letting answers in flight
finish.

Bounds (config/api.py `limits`): at most `connections` open at once (past it uvicorn answers
503 and closes), a request head within `idle` seconds of a connection's start or its last
answer (api/connections.py), headers within `header_bytes`, bodies within `body_bytes`
(api/limits.BodyLimit), and idle keep-alive connections closed after `idle`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import stat
from collections.abc import Generator
from typing import Any

import anyio.to_thread
import uvicorn

from nodeagent.api.app import asgi
from nodeagent.api.connections import ApiProtocol
from nodeagent.api.service import Service
from nodeagent.config.api import ApiSettings
from nodeagent.telemetry.sdnotify import Notifier

log = logging.getLogger(__name__)
READY_POLL_S = 0.05  # how often serve() looks whether every server serves yet
THREADS = 256  # the routes' worker threads (each blocking read, or wait for an answer, holds one)


class _Server(uvicorn.Server):
    """uvicorn's server, without its own signal handlers: `serve` stops every server."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def _bound_handshakes(loop: asyncio.AbstractEventLoop, seconds: float) -> None:
    """A client that never sends its TLS hello holds its descriptor `seconds`, not asyncio's
    default 60: uvicorn passes no ssl_handshake_timeout to create_server, so this loop's
    create_server adds it (the loop is the service's own, for its whole life)."""
    create_server = loop.create_server

    async def bounded(*args: Any, **kwargs: Any) -> asyncio.Server:
        if kwargs.get("ssl") is not None:
            kwargs.setdefault("ssl_handshake_timeout", seconds)
        return await create_server(*args, **kwargs)

    loop.create_server = bounded  # type: ignore[method-assign]


def unix_socket(path: str, mode: int) -> socket.socket:
    """A listening socket at `path` (a stale socket there, one a crash left, is replaced;
    anything else is not, and neither is one that a running service still answers on).

    Raises:
        OSError: cannot be made; FileExistsError: something other than a stale socket is there.
    """
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise FileExistsError(f"{path} exists and is not a socket: remove it or pick another")
        if answers(path):
            raise FileExistsError(
                f"{path}: another process listens on it (a second nodeagent api?): stop it or "
                "pick another socket"
            )
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, mode)
    sock.listen(1024)
    return sock


def answers(path: str) -> bool:
    """Something listens on the Unix socket at `path` (a stale socket file refuses)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        return probe.connect_ex(path) == 0


def tcp_socket(listen: str) -> socket.socket:
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    sock.listen(1024)
    return sock


def _config(service: Service, tls: bool) -> uvicorn.Config:
    settings = service.settings
    limits = settings.limits
    bounds = {"head_timeout": limits.idle, "head_bytes": limits.header_bytes}
    protocol = type("Protocol", (ApiProtocol,), bounds)
    return uvicorn.Config(
        asgi(service),
        http=protocol,
        lifespan="off",
        log_config=None,
        access_log=False,
        limit_concurrency=limits.connections,
        timeout_keep_alive=max(1, round(limits.idle)),
        ssl_certfile=settings.tls_cert if tls else None,
        ssl_keyfile=settings.tls_key if tls else None,
        server_header=False,
    )


async def serve(
    service: Service, sockets: list[tuple[socket.socket, bool]], notifier: Notifier | None = None
) -> None:
    """Serve on each (socket, with TLS) until SIGTERM or SIGINT. Under systemd (`notifier`),
    READY=1 once every server serves, STOPPING=1 when told to stop: the unit is Type=notify,
    so `systemctl start` (and the Ansible role's task) fails when the service exits first."""
    anyio.to_thread.current_default_thread_limiter().total_tokens = THREADS
    servers = [(_Server(_config(service, tls)), sock) for sock, tls in sockets]

    def stop() -> None:  # a flag only: each server finishes what is in flight
        if notifier is not None:
            notifier.send("STOPPING=1")
        for server, _ in servers:
            server.should_exit = True

    async def ready() -> None:
        while not all(server.started for server, _ in servers):
            if any(server.should_exit for server, _ in servers):
                return
            await asyncio.sleep(READY_POLL_S)
        if notifier is not None:
            notifier.ready(f"serving pool {service.settings.pool}")

    loop = asyncio.get_running_loop()
    _bound_handshakes(loop, service.settings.limits.idle)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop)
    await asyncio.gather(ready(), *(server.serve(sockets=[sock]) for server, sock in servers))


def listening(settings: ApiSettings) -> list[tuple[socket.socket, bool]]:
    """The sockets the settings name: the Unix socket (no TLS), the network address (TLS)."""
    found: list[tuple[socket.socket, bool]] = []
    if settings.socket:
        found.append((unix_socket(settings.socket, settings.socket_mode), False))
    if settings.listen:
        found.append((tcp_socket(settings.listen), True))
    return found
