"""A small HTTP server for /metrics and /healthz that no client can exhaust.

A thread per connection (http.server's ThreadingHTTPServer) lets idle or half-sent requests pin
a thread and a descriptor each: 3,000 of them held 3,005 threads, and with the open-file limit at
1,024 the agent later failed to open anything (EMFILE). Here one thread serves every connection
through a selector, so an idle connection costs a descriptor and a small buffer, never a thread:

- each connection has one deadline (`timeout`) for its whole exchange, however slowly it sends;
- at most `max_connections` are open; a new one closes the oldest that has not sent its request
  yet, so a legitimate scrape, which sends its request at once, is always answered;
- running out of descriptors (EMFILE, ENFILE) on accept closes the oldest such connection (or,
  with none, pauses accepting for half a second), logs a clear error at most once a minute and
  tries again: it never ends the server.

Requests are answered one at a time on that thread (a scrape renders in milliseconds) and every
response closes its connection. Request lines over 8 KiB get 414, headers over 64 KiB 431.

A request that takes longer than a scrape (a live job's stacks, a command run for its user) is
handed off: a `Handoff` that wants it gets the connection, whole, in a thread of its own (at
most `max_handoffs` at once: beyond, 503), so the scrapes go on meanwhile.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger(__name__)

Route = Callable[[str], tuple[int, bytes, str]]  # path -> (status, body, content type)
MAX_REQUEST_LINE = 8192
MAX_HANDOFFS = 16  # connections served in threads of their own at once
MAX_HEADER = 65536
TEXT = "text/plain"
STARVED_LOG_S = 60.0  # report running out of descriptors at most this often
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    414: "URI Too Long",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def response(status: int, body: bytes, content_type: str, head: bool = False) -> bytes:
    lines = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if status == 405:
        lines.append("Allow: GET, HEAD")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (b"" if head else body)


class Handoff(Protocol):
    """Requests served outside the server's thread."""

    def wants(self, method: str, target: str) -> bool:
        """Whether this request is its to serve."""
        ...

    def take(self, sock: socket.socket, head: bytes, rest: bytes) -> None:
        """Serve the request of `head` on `sock` (blocking, no timeout set: set one), `rest`
        what came after the head; runs in a thread of its own, which closes `sock` after."""
        ...


class SlowRoutes:
    """A `Handoff` of GET routes by their path's prefix, each answered whole in its thread."""

    def __init__(self, routes: dict[str, Route], timeout: float = 10.0) -> None:
        """`timeout`: for sending the answer once it is made."""
        self._routes = routes
        self._timeout = timeout

    def wants(self, method: str, target: str) -> bool:
        return method in ("GET", "HEAD") and self._route(target) is not None

    def take(self, sock: socket.socket, head: bytes, rest: bytes) -> None:
        said = request_line(head)
        route = self._route(said[1]) if said is not None else None
        assert route is not None  # wants() said so
        reply = answer(head, route)
        sock.settimeout(self._timeout)
        sock.sendall(reply)

    def _route(self, target: str) -> Route | None:
        return next((r for p, r in self._routes.items() if target.startswith(p)), None)


class Handoffs:
    """Several handoffs as one: the first that wants a request takes it."""

    def __init__(self, *handoffs: Handoff) -> None:
        self._handoffs = handoffs

    def wants(self, method: str, target: str) -> bool:
        return any(h.wants(method, target) for h in self._handoffs)

    def take(self, sock: socket.socket, head: bytes, rest: bytes) -> None:
        said = request_line(head)
        assert said is not None  # wants() read it
        next(h for h in self._handoffs if h.wants(*said)).take(sock, head, rest)


def request_line(head: bytes) -> tuple[str, str] | None:
    """The method and target of a request head, or None for a malformed one. Pure."""
    line, _, _ = head.partition(b"\r\n")
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
        return None
    return parts[0].decode("latin-1"), parts[1].decode("latin-1")


def answer(request: bytes, route: Route) -> bytes:
    """The response to one complete request head (everything before the blank line). Pure."""
    said = request_line(request)
    if said is None:
        return response(400, b"bad request\n", "text/plain")
    method, target = said
    if method not in ("GET", "HEAD"):
        return response(405, b"only GET and HEAD\n", "text/plain")
    try:
        status, body, content_type = route(target)
    except Exception:  # a failing collector must not end the server
        log.exception("metrics: answering %s failed", target[:200])
        status, body, content_type = 500, b"internal error\n", "text/plain"
    return response(status, body, content_type, head=method == "HEAD")


def too_large(buffer: bytes) -> bytes | None:
    """The error response for a request head that grew past the limits, if it did."""
    end_of_line = buffer.find(b"\r\n")
    if (end_of_line < 0 and len(buffer) > MAX_REQUEST_LINE) or end_of_line > MAX_REQUEST_LINE:
        return response(414, b"request line too long\n", "text/plain")
    if len(buffer) > MAX_HEADER:
        return response(431, b"request headers too large\n", "text/plain")
    return None


@dataclass
class _Conn:
    sock: socket.socket
    deadline: float
    inbox: bytes = b""
    outbox: bytes | None = None  # the response, once the request is complete
    sent: int = field(default=0)


class HttpServer:
    """Serves `route` on `address` from one thread (`serve_forever`) until `shutdown`."""

    def __init__(
        self,
        address: tuple[str, int],
        route: Route,
        max_connections: int = 64,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        handoff: Handoff | None = None,
        max_handoffs: int = MAX_HANDOFFS,
    ) -> None:
        host, port = address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host.strip("[]"), port))
            self._listener.listen(128)
        except OSError:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        self._route = route
        self._handoff = handoff
        self._handoffs = threading.BoundedSemaphore(max(1, max_handoffs))
        self._max = max(1, max_connections)
        self._timeout = timeout
        self._clock = clock
        self._conns: dict[int, _Conn] = {}
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._stop = threading.Event()
        self._done = threading.Event()
        self._paused_until: float | None = None
        self._starved = 0  # accepts that ran out of descriptors since the last report
        self._starved_logged: float | None = None
        self.address = self._listener.getsockname()[:2]

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def serve_forever(self) -> None:
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                self._step()
        finally:
            for conn in list(self._conns.values()):
                self._close(conn)
            self._selector.close()
            self._done.set()

    def shutdown(self) -> None:
        """Stop serve_forever (from another thread) and wait for it."""
        self._stop.set()
        self._wake_w.send(b"x")
        self._done.wait(5)

    def server_close(self) -> None:
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()

    def _step(self) -> None:
        now = self._clock()
        if self._paused_until is not None and now >= self._paused_until:
            self._paused_until = None
            self._selector.register(self._listener, selectors.EVENT_READ)
        deadlines = [c.deadline for c in self._conns.values()]
        if self._paused_until is not None:
            deadlines.append(self._paused_until)
        wait = max(0.0, min(deadlines) - now) if deadlines else None
        for key, events in self._selector.select(wait):
            if key.fileobj is self._listener:
                self._accept()
            elif key.fileobj is self._wake_r:
                self._wake_r.recv(64)
            elif (conn := self._conns.get(key.fd)) is not None:
                self._serve(conn, events)
        now = self._clock()
        for conn in [c for c in self._conns.values() if c.deadline <= now]:
            self._close(conn)

    def _accept(self) -> None:
        for _ in range(64):  # a batch, then let the others run
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno not in _OUT_OF_FDS:
                    log.warning("metrics server: accept failed: %s", exc)
                    return
                self._out_of_descriptors(exc)
                return
            if len(self._conns) >= self._max and not self._evict_idle():
                sock.close()  # every slot is writing a response: this client retries
                continue
            sock.setblocking(False)
            conn = _Conn(sock, self._clock() + self._timeout)
            self._conns[sock.fileno()] = conn
            self._selector.register(sock, selectors.EVENT_READ)

    def _out_of_descriptors(self, exc: OSError) -> None:
        now = self._clock()
        self._starved += 1
        if self._starved_logged is None or now - self._starved_logged >= STARVED_LOG_S:
            log.error(
                "metrics server: out of file descriptors (%s) with %d connections open, %d "
                "time(s) since the last report; closing the oldest idle one and retrying",
                exc.strerror,
                len(self._conns),
                self._starved,
            )
            self._starved_logged, self._starved = now, 0
        if not self._evict_idle():  # nothing to free: stop accepting for a moment
            self._selector.unregister(self._listener)
            self._paused_until = self._clock() + 0.5

    def _evict_idle(self) -> bool:
        """Close the oldest connection that has not sent a whole request; False if none."""
        idle = [c for c in self._conns.values() if c.outbox is None]
        if not idle:
            return False
        self._close(min(idle, key=lambda c: c.deadline))
        return True

    def _serve(self, conn: _Conn, events: int) -> None:
        try:
            if conn.outbox is None and events & selectors.EVENT_READ:
                self._receive(conn)
            if conn.outbox is not None:
                conn.sent += conn.sock.send(conn.outbox[conn.sent :])
                if conn.sent >= len(conn.outbox):
                    self._close(conn)
        except BlockingIOError:
            return
        except OSError:
            self._close(conn)

    def _receive(self, conn: _Conn) -> None:
        chunk = conn.sock.recv(16384)
        if not chunk:
            self._close(conn)
            return
        conn.inbox += chunk
        head, found, _ = conn.inbox.partition(b"\r\n\r\n")
        error = too_large(head if found else conn.inbox)
        if error is None and not found:
            return
        said = request_line(head) if error is None else None
        if said is not None and self._handoff is not None and self._handoff.wants(*said):
            error = self._hand_off(conn, head)
            if error is None:
                return
        conn.outbox = error if error is not None else answer(head, self._route)
        conn.inbox = b""
        self._selector.modify(conn.sock, selectors.EVENT_WRITE)

    def _hand_off(self, conn: _Conn, head: bytes) -> bytes | None:
        """Give `conn` to the handoff in a thread of its own; else the 503 to answer."""
        assert self._handoff is not None
        if not self._handoffs.acquire(blocking=False):
            return response(503, b"busy: too many long requests at once; try again\n", TEXT)
        rest = conn.inbox.partition(b"\r\n\r\n")[2]
        thread = threading.Thread(
            target=self._serve_handed, args=(conn.sock, head, rest), name="handoff", daemon=True
        )
        self._conns.pop(conn.sock.fileno(), None)
        self._selector.unregister(conn.sock)
        conn.sock.setblocking(True)
        try:
            thread.start()
        except RuntimeError:  # no thread to be had: this request is refused, the server goes on
            self._handoffs.release()
            with contextlib.suppress(OSError):
                conn.sock.sendall(response(503, b"busy: no thread for it; try again\n", TEXT))
            conn.sock.close()
        return None

    def _serve_handed(self, sock: socket.socket, head: bytes, rest: bytes) -> None:
        assert self._handoff is not None
        try:
            self._handoff.take(sock, head, rest)
        except Exception:  # one request's failure must not end the server
            log.exception("metrics server: serving a handed-off request failed")
        finally:
            sock.close()
            self._handoffs.release()

    def _close(self, conn: _Conn) -> None:
        if self._conns.pop(conn.sock.fileno(), None) is not None:
            self._selector.unregister(conn.sock)
        conn.sock.close()
