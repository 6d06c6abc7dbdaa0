"""The API service's HTTP connections: uvicorn's httptools protocol (llhttp, the parser of
Node.js: several times h11's requests a second) with three things added.

- Who is on the other end of the Unix socket: the kernel's SO_PEERCRED (pid, uid, gid), read
  once when the connection is made and handed to the app in each request's scope
  (`scope["nodeagent.peer"]`). A client cannot forge it; a TCP connection has none.
- A deadline for each request's head: a connection that has not sent a whole request head
  within `head_timeout` seconds of being made (or of its last response) is closed, so slow or
  silent clients hold no descriptor for long (uvicorn's keep-alive timer stops at the first
  byte, which a slow client sends at once).
- A bound on a request head's size (its URL and headers: `head_bytes`), answered 400 and
  closed past it.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

PEER_KEY = "nodeagent.peer"
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_of(transport: asyncio.BaseTransport) -> tuple[int, int, int] | None:
    """(pid, uid, gid) of a Unix socket's peer; None for any other transport."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return pid, uid, gid


class _WithPeer:
    """The app, with the connection's peer in each request's scope."""

    def __init__(self, app: Any, peer: tuple[int, int, int] | None) -> None:
        self._app = app
        self._peer = peer

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        scope[PEER_KEY] = self._peer
        await self._app(scope, receive, send)


class ApiProtocol(HttpToolsProtocol):
    head_timeout = 10.0  # set by the server (api/server.py): limits.idle
    head_bytes = 16 * 1024  # limits.header_bytes
    _head_deadline: asyncio.TimerHandle | None = None
    _head_size = 0

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_size = 0

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _count(self, size: int) -> None:
        """Raises: httptools.HttpParserError past head_bytes (uvicorn answers 400, closes)."""
        self._head_size += size
        if self._head_size > self.head_bytes:
            raise httptools.HttpParserError(f"request head over {self.head_bytes} bytes")

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.app = _WithPeer(self.app, peer_of(transport))
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._head_deadline = self.loop.call_later(self.head_timeout, self._head_late)

    def _disarm(self) -> None:
        deadline = getattr(self, "_head_deadline", None)
        if deadline is not None:
            deadline.cancel()
        self._head_deadline = None

    def _head_late(self) -> None:
        """No request head came in time: close, unless a request is being served."""
        cycle = self.cycle
        if (cycle is None or cycle.response_complete) and not self.transport.is_closing():
            self.transport.close()
