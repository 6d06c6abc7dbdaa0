"""The agent's side of `nodeagentctl run` (the wire: telemetry/runwire.py): a POST /run/JOB handed
off by the metrics server to a thread of its own, checked (pool.auth: munge, the job's user
alone), started in the job as its user (Supervisor.command: its cgroup, namespaces, GPUs) and
relayed: its output as it comes, a beat while it is silent, the signals its caller sends, what
it feeds its stdin (and how much of that it took), then how it ended. A caller that goes away
hangs it up (SIGHUP, SIGTERM, SIGKILL after HANG_UP_GRACE_S); what it left in its process group
is killed at its end. The thread that started it waits for it: if the agent dies, the kernel
kills it (PR_SET_PDEATHSIG), and the job's cgroup is swept by the next agent.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import contextlib
import json
import logging
import os
import select
import signal
import socket
import time
from collections.abc import Callable
from typing import Protocol

from nodeagent.supervisor.command import Command
from nodeagent.telemetry.httpd import TEXT, request_line, response
from nodeagent.telemetry.runwire import (
    BEAT_S,
    MAX_BODY,
    PREFIX,
    RunOrder,
    frame,
    parse_order,
    parse_target,
    parse_window,
    run_digest,
    signal_named,
)
from nodeagent.telemetry.stacks import JobAccess

log = logging.getLogger(__name__)
BODY_TIMEOUT_S = 10.0  # to send the request's body
SEND_TIMEOUT_S = 30.0  # a caller that reads nothing for this long is gone
HANG_UP_GRACE_S = 10.0
MAX_LINE = 256 * 1024  # of the caller's: what is typed comes in lines of base64
DRAIN_S = 1.0  # after its exit, what is left of its output is sent for this long at most


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal other than the first and last
        return f"SIG{number}"


def _notice_silence(sock: socket.socket) -> None:
    """A caller whose host vanished (no FIN, no RST) is noticed within SEND_TIMEOUT_S, not
    when TCP gives up retrying, 15 minutes on: keepalives, and a bound on unacknowledged data."""
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, int(SEND_TIMEOUT_S / 2))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(SEND_TIMEOUT_S * 1000))


class Runs(Protocol):
    """A job this node serves, as a command run in it needs it (runtime/jobrun.JobRun)."""

    @property
    def uid(self) -> int: ...

    def command(self, order: RunOrder) -> Command: ...


class CallerGone(Exception):
    """The caller's connection closed or stopped reading."""


class RunHandoff:
    """telemetry/httpd.Handoff for POST /run/JOB."""

    def __init__(
        self, node: str, jobs: Callable[[str], Runs | None], access: JobAccess | None
    ) -> None:
        """`jobs`: the job this node serves by that id (None: none); `access`: who may run
        (None: pool.auth none, where nobody may)."""
        self._node = node
        self._jobs = jobs
        self._access = access

    def wants(self, method: str, target: str) -> bool:
        return method == "POST" and target.startswith(PREFIX)

    def take(self, sock: socket.socket, head: bytes, rest: bytes) -> None:
        sock.settimeout(BODY_TIMEOUT_S)
        command = self._start(sock, head, rest)
        if isinstance(command, tuple):
            status, said = command
            with contextlib.suppress(OSError):
                sock.sendall(response(status, f"{said}\n".encode(), TEXT))
            return
        try:
            _Relay(sock, command).run()
        finally:
            command.close()

    def _start(self, sock: socket.socket, head: bytes, rest: bytes) -> Command | tuple[int, str]:
        """The command started, or the error to answer."""
        said = request_line(head)
        assert said is not None  # the server handed off a request it could read
        found = parse_target(said[1])
        if isinstance(found, str):
            return 400, found
        job, credential = found
        body = _body(sock, head, rest)
        if isinstance(body, tuple):
            return body
        order = parse_order(body)
        if isinstance(order, str):
            return 400, order
        if self._access is None:
            return 403, (
                "this pool runs no command for its users: only pool.auth: munge tells who asks "
                "(docs/interactive.md)"
            )
        runs = self._jobs(job)
        if runs is None:
            return 404, f"node {self._node} runs no job {job}"
        digest = run_digest(job, self._node, body)  # a credential for another node is refused
        why = self._access.may_act(digest, credential, runs.uid, False)
        if why is not None:
            return 403, why
        try:
            command = runs.command(order)
        except OSError as exc:
            return 409, f"node {self._node}: cannot start {order.argv[0]!r}: {exc.strerror or exc}"
        log.info("run: %s for job %s started as pid %d", order.argv[0], job, command.pid)
        return command


def _body(sock: socket.socket, head: bytes, rest: bytes) -> bytes | tuple[int, str]:
    """The request's body (Content-Length), or the error to answer."""
    length = None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value) if value.strip().isdigit() else -1
    if length is None or not 0 < length <= MAX_BODY:
        return 400, f"expected a Content-Length of 1 to {MAX_BODY} bytes"
    body = rest
    deadline = time.monotonic() + BODY_TIMEOUT_S  # for the whole body, however slowly sent
    try:
        while len(body) < length:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError()
            sock.settimeout(left)
            chunk = sock.recv(min(65536, length - len(body)))
            if not chunk:
                return 400, "the body ended early"
            body += chunk
    except OSError:
        return 400, f"the body did not come within {BODY_TIMEOUT_S:g} s"
    return body[:length]


class _Relay:
    """One command's output to its caller, its caller's signals to it, until it ends."""

    def __init__(self, sock: socket.socket, command: Command) -> None:
        self._sock = sock
        self._command = command
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._inbox = b""
        self._said_at = time.monotonic()
        self._beats = 0
        self._told_taken = 0  # of its stdin, what the caller was told it took
        self._told_closed = False  # and that it takes no more

    def run(self) -> None:
        self._sock.settimeout(SEND_TIMEOUT_S)
        _notice_silence(self._sock)
        try:
            self._send_raw(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n\r\n")
            code = self._relay()
        except CallerGone:
            code = self._command.hang_up(HANG_UP_GRACE_S)
            log.info("run: its caller went away; hung up (status %d)", code)
            return
        with contextlib.suppress(CallerGone):
            if code >= 0:
                self._send({"exit": code})
            else:
                self._send({"signal": _signal_name(-code)})

    def _relay(self) -> int:
        """Its output sent as it comes, its caller's lines obeyed, until it exits (what it
        left in its group killed then: Command.wait); then what is left of its output; its
        status."""
        output, caller = self._command.output, self._sock.fileno()
        os.set_blocking(output, False)
        code: int | None = None
        drain_until = 0.0
        while True:
            pending = self._command.pending_input
            readable, writable, _ = select.select(
                [output, caller], [self._command.input] if pending else [], [], BEAT_S / 3
            )
            if caller in readable:
                with contextlib.suppress(BlockingIOError, TimeoutError):
                    self._receive()
            if writable:
                self._command.flush_input()
            self._tell_taken()
            if output in readable and not self._read_output():
                break  # every writer of its output closed it
            if code is None:
                code = self._command.wait(0)
                if code is not None:  # its group was killed with it: its output ends soon
                    drain_until = time.monotonic() + DRAIN_S
            elif time.monotonic() >= drain_until:
                break
            self._beat()
        if code is None:
            code = self._await_end()
        tail = self._decoder.decode(b"", final=True)
        if tail:
            self._send({"out": tail})
        return code

    def _read_output(self) -> bool:
        """Send what it wrote; False at its output's end."""
        try:
            data = os.read(self._command.output, 65536)
        except BlockingIOError:
            return True
        except OSError:  # EIO: every end of its terminal closed
            return False
        if data:
            self._send({"out": self._decoder.decode(data)})
        return bool(data)

    def _await_end(self) -> int:
        """Its status, once it exits (it closed its output first)."""
        while True:
            code = self._command.wait(BEAT_S / 3)
            if code is not None:
                return code
            if select.select([self._sock.fileno()], [], [], 0)[0]:
                with contextlib.suppress(BlockingIOError, TimeoutError):
                    self._receive()
            self._command.flush_input()  # it may read its stdin still
            self._tell_taken()
            self._beat()

    def _receive(self) -> None:
        """The caller's signal lines; its connection's end is CallerGone."""
        try:
            chunk = self._sock.recv(65536)
        except (BlockingIOError, TimeoutError):
            raise
        except OSError as exc:
            raise CallerGone() from exc
        if not chunk:
            raise CallerGone()
        self._inbox += chunk
        while b"\n" in self._inbox:
            line, _, self._inbox = self._inbox.partition(b"\n")
            with contextlib.suppress(ValueError, TypeError, AttributeError, binascii.Error):
                self._obey(json.loads(line))
        if len(self._inbox) > MAX_LINE:  # no line this long: not a caller of ours
            raise CallerGone()

    def _obey(self, doc: dict[str, object]) -> None:
        """One line of the caller's: a signal, what is typed (or fed to its stdin), its stdin's
        end, a terminal's new size."""
        if "signal" in doc:
            sig = signal_named(str(doc["signal"]))
            if sig is not None:
                self._command.signal(sig)
        elif "in" in doc and isinstance(doc["in"], str):
            self._command.write(base64.b64decode(doc["in"], validate=True))
        elif doc.get("eof") is True:
            self._command.end_input()
        elif "resize" in doc:
            window = parse_window(doc["resize"])
            if isinstance(window, tuple):
                self._command.resize(*window)

    def _tell_taken(self) -> None:
        """How much of its stdin it took, when that moved (the caller feeds it that much more:
        runwire.STDIN_WINDOW); nothing for a terminal's keys."""
        taken, closed = self._command.taken, self._command.input_closed
        if self._command.terminal or (taken, closed) == (self._told_taken, self._told_closed):
            return
        self._told_taken, self._told_closed = taken, closed
        self._send({"took": taken, "closed": True} if closed else {"took": taken})

    def _beat(self) -> None:
        if time.monotonic() - self._said_at >= BEAT_S:
            self._beats += 1
            self._send({"beat": self._beats})

    def _send(self, doc: dict[str, object]) -> None:
        self._send_raw(frame(doc))

    def _send_raw(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise CallerGone() from exc
        self._said_at = time.monotonic()
