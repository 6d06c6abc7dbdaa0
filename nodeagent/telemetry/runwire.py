"""A command run in a job on a node, for its user (`nodeagentctl run`, as srun): the wire
between nodeagentctl and a node's agent, pure but for the socket calls of `RunStream`
(docs/interactive.md, "Commands across an allocation").

The request, on the agent's metrics port (handed to a thread of its own, telemetry/httpd):

    POST /run/<job>?credential=C HTTP/1.1
    Content-Length: N

    {"argv": [...], "rank": R, "size": S, "env": {NAME: VALUE}, "window": [ROWS, COLUMNS],
     "stdin": true}

The credential is MUNGE's, of the job's user alone (not an operator: a command run as someone
else is not theirs to start), bound to the method, the target, the node and the body
(`run_digest`). The stream itself is plain TCP, as the rest of the metrics port: its integrity
is the network's. A
pool without pool.auth: munge runs no command: nobody could tell who asks.

The answer, once the command started: `200` and newline-delimited JSON frames until the end,
`{"out": text}` (its output, stdout and stderr together), `{"beat": n}` every BEAT_S seconds
while it says nothing, then `{"exit": code}` or `{"signal": name}` (it was killed) or
`{"error": why}`. Before that, an error is an HTTP status with a line of text. The client sends
`{"signal": name}` lines (SIGNALS) the other way; its connection closing hangs the command up.
With a `window`, the command runs on a terminal of that size (`run --pty`): its output is the
terminal's, and the client also sends what is typed, `{"in": base64}`, and the terminal's new
size, `{"resize": [ROWS, COLUMNS]}`.

With `"stdin": true` (and no window) the command's stdin is a pipe the client feeds: `{"in":
base64}` frames, then `{"eof": true}`. The agent says how much of it the command has taken so
far, `{"took": n}` (bytes, in all: written to the pipe, or dropped once the command closed its
end, then with `"closed": true`: feed it no more), and the client keeps at most STDIN_WINDOW
bytes sent and not taken: a command that reads slowly, or not at all, holds the client back,
never the agent's relay, which goes on reading the client's signals.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import signal
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nodeagent.model.credential import bound, digest_of
from nodeagent.model.decode import NAME_RE

PREFIX = "/run/"
MAX_BODY = 256 * 1024
MAX_ARGS = 4096
BEAT_S = 3.0  # the agent says it is there this often while the command is silent
LOST_S = 15.0  # a node that says nothing for this long is lost (five beats missed)
STDIN_WINDOW = 256 * 1024  # a command's stdin sent and not yet taken, at most
STDIN_CHUNK = 48 * 1024  # read and sent at a time (64 KiB as base64: within a caller's line)
# What a client may send a command: those a terminal sends (Ctrl-C, Ctrl-\), a hang-up, a
# polite and a final end, the user signals a training script handles, and a stop and go.
SIGNALS = frozenset(
    {"SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGKILL", "SIGUSR1", "SIGUSR2", "SIGCONT"}
)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_CREDENTIAL = re.compile(r"MUNGE:[A-Za-z0-9+/=]{1,4000}:")


@dataclass(frozen=True)
class RunOrder:
    """What to run: `argv` as task `rank` of `size`, with `env` set over the job's; `window`:
    on a terminal of (rows, columns)."""

    argv: tuple[str, ...]
    rank: int = 0
    size: int = 1
    env: Mapping[str, str] = field(default_factory=dict)
    window: tuple[int, int] | None = None
    stdin: bool = False  # fed by the client (without a window), else closed

    def body(self) -> bytes:
        doc: dict[str, object] = {
            "argv": list(self.argv),
            "rank": self.rank,
            "size": self.size,
            "env": self.env,
        }
        if self.window is not None:
            doc["window"] = list(self.window)
        if self.stdin:
            doc["stdin"] = True
        return json.dumps(doc).encode()


def run_digest(job: str, node: str, body: bytes) -> str:
    """What a run request's credential binds: its method, target, the node it is for (one
    replayed at another node of the job is refused there) and its body."""
    return digest_of(f"POST {PREFIX}{job} {node}\n".encode() + body)


def run_payload(job: str, node: str, body: bytes) -> str:
    return bound(run_digest(job, node, body))


def parse_target(target: str) -> tuple[str, str] | str:
    """The job and credential of a request's target, or why it is a bad one. Pure."""
    path, _, query = target.partition("?")
    job = path.removeprefix(PREFIX)
    if not path.startswith(PREFIX) or not NAME_RE.fullmatch(job):
        return "expected /run/JOB with a valid job id"
    name, _, credential = query.partition("=")
    if name != "credential" or not _CREDENTIAL.fullmatch(credential):
        return "expected ?credential=<a MUNGE credential> (nodeagentctl run signs its requests)"
    return job, credential


def parse_order(body: bytes) -> RunOrder | str:
    """The order a request's body gives, or why it is a bad one. Pure."""
    try:
        doc = json.loads(body)
    except ValueError:
        return "the body is not JSON"
    if not isinstance(doc, dict) or set(doc) - {"argv", "rank", "size", "env", "window", "stdin"}:
        return "expected {argv, rank, size, env, window, stdin}"
    argv, rank, size, env = doc.get("argv"), doc.get("rank", 0), doc.get("size", 1), doc.get("env")
    if not isinstance(argv, list) or not argv or len(argv) > MAX_ARGS:
        return f"argv: a list of 1 to {MAX_ARGS} strings"
    if not all(isinstance(a, str) and "\0" not in a for a in argv) or not argv[0]:
        return "argv: strings without NUL, the first not empty"
    if not (_count(rank) and _count(size) and rank < size):
        return f"rank and size: whole numbers, 0 <= rank < size (got {rank!r}, {size!r})"
    env = {} if env is None else env
    if not isinstance(env, dict):
        return "env: an object of NAME: VALUE"
    for name, value in env.items():
        if not _ENV_NAME.fullmatch(name) or not isinstance(value, str) or "\0" in value:
            return f"env: bad variable {str(name)[:40]!r}: a name of letters, digits and _"
    window = parse_window(doc.get("window"))
    if isinstance(window, str):
        return window
    stdin = doc.get("stdin", False)
    if not isinstance(stdin, bool) or (stdin and window is not None):
        return "stdin: true or false, and not with a window (a terminal is its own stdin)"
    return RunOrder(tuple(argv), rank, size, env, window, stdin)


def parse_window(value: object) -> tuple[int, int] | str | None:
    """A terminal's size, [rows, columns] (None: no terminal), or why it is a bad one. Pure."""
    if value is None:
        return None
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and 0 < v < 10_000 for v in value)
    ):
        return value[0], value[1]
    return f"window: [rows, columns], each 1 to 9999 (got {str(value)[:40]})"


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 20


def frame(doc: Mapping[str, object]) -> bytes:
    return json.dumps(doc, ensure_ascii=False).encode() + b"\n"


def signal_named(name: str) -> signal.Signals | None:
    """The signal a client may send by that name (None: not one of SIGNALS)."""
    return signal.Signals[name] if name in SIGNALS else None


def exit_status(code: int | None, killed_by: str | None) -> int:
    """A command's end as a shell says it: its code, 128 + a signal's number, 255 unknown."""
    if killed_by is not None:
        found = signal_named(killed_by) or getattr(signal, killed_by, None)
        return 128 + int(found) if found is not None else 255
    return 255 if code is None else code


class RunRefused(Exception):
    """The agent answered the request with an error: `code` and its words."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class RunStream:
    """One node's command, from the client's side: `open` it, read its frames, signal it."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = b""
        self._sending = threading.Lock()  # a frame is sent whole, whoever sends it
        self._room = threading.Condition()  # its stdin: what was sent, what it took
        self._fed = 0
        self._taken = 0
        self._over = False  # it ended, or its stdin did: nothing more is fed to it
        self.broken = ""  # why a frame could not be sent: then no more is

    @classmethod
    def open(
        cls,
        address: str,
        job: str,
        order: RunOrder,
        credential: str,
        timeout: float = 10.0,
    ) -> RunStream:
        """Send the request to the agent at `address` ("host:port") and read its answer's head.

        Raises:
            RunRefused: it answered an error; OSError: unreachable, or no answer.
        """
        host, _, port = address.rpartition(":")
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
        try:
            body = order.body()
            head = (
                f"POST {PREFIX}{job}?credential={credential} HTTP/1.1\r\nHost: {host}\r\n"
                f"Content-Length: {len(body)}\r\nContent-Type: application/json\r\n\r\n"
            )
            sock.sendall(head.encode() + body)
            stream = cls(sock)
            status, said = stream._head()
            if status != 200:
                raise RunRefused(f"it answered {status}: {said}", status)
            sock.settimeout(LOST_S)
            return stream
        except BaseException:
            sock.close()
            raise

    def _head(self) -> tuple[int, str]:
        while b"\r\n\r\n" not in self._buffer:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise OSError("it closed the connection without an answer")
            self._buffer += chunk
            if len(self._buffer) > 65536:
                raise OSError("its answer's head is too long")
        head, _, self._buffer = self._buffer.partition(b"\r\n\r\n")
        line = head.split(b"\r\n")[0].split(b" ", 2)
        try:
            status = int(line[1])
        except (IndexError, ValueError):
            raise OSError(f"it answered garbage: {head[:80]!r}") from None
        if status == 200:
            return status, ""
        self._sock.settimeout(5.0)
        try:
            while chunk := self._sock.recv(4096):
                self._buffer += chunk
                if len(self._buffer) > 4096:
                    break
        except OSError:
            pass
        return status, self._buffer[:300].decode("utf-8", "replace").strip()

    def frames(self) -> Iterator[dict[str, Any]]:
        """Its frames as they come, until the connection ends.

        Raises:
            TimeoutError: nothing came for LOST_S; OSError: the connection broke;
            ValueError: a frame is not a JSON object.
        """
        while True:
            while b"\n" in self._buffer:
                line, _, self._buffer = self._buffer.partition(b"\n")
                doc = json.loads(line)
                if not isinstance(doc, dict):
                    raise ValueError(f"a frame that is not an object: {line[:80]!r}")
                yield doc
            chunk = self._sock.recv(65536)
            if not chunk:
                return
            self._buffer += chunk

    def signal(self, name: str) -> None:
        """Send the command signal `name` (one of SIGNALS); a broken connection is let be (its
        reader says so)."""
        self._tell({"signal": name})

    def type(self, data: bytes) -> None:
        """What is typed, for its terminal (run --pty)."""
        self._tell({"in": base64.b64encode(data).decode()})

    def feed(self, data: bytes) -> bool:
        """Send `data` (at most STDIN_WINDOW bytes) to its stdin once it has taken enough of
        what came before; False if it ended first (`over`)."""
        with self._room:
            while not self._over and self._fed - self._taken + len(data) > STDIN_WINDOW:
                self._room.wait()
            if self._over:
                return False
            self._fed += len(data)
        self.type(data)
        return True

    def end_input(self) -> None:
        """Its stdin ends (after what was fed)."""
        self._tell({"eof": True})

    def took(self, taken: int, closed: bool = False) -> None:
        """Its agent says it has taken `taken` bytes of its stdin in all (`closed`: and takes
        no more)."""
        with self._room:
            self._taken = max(self._taken, taken)
            self._over = self._over or closed
            self._room.notify_all()

    def over(self) -> None:
        """It ended: nothing more is fed to it."""
        with self._room:
            self._over = True
            self._room.notify_all()

    def resize(self, rows: int, columns: int) -> None:
        self._tell({"resize": [rows, columns]})

    def _tell(self, doc: Mapping[str, object]) -> None:
        """Send a frame whole. One that cannot be (a send that failed or stalled for LOST_S
        would leave a part of it) ends the stream: its reader stops, the node is lost."""
        with self._sending:
            if self.broken:
                return
            try:
                self._sock.sendall(frame(doc))
            except OSError as exc:
                self.broken = f"lost: cannot send to its agent: {exc or type(exc).__name__}"
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)
        if self.broken:
            self.over()

    def close(self) -> None:
        self.over()
        self._sock.close()


def exports(pairs: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """`--export NAME=VALUE` or `--export NAME` (its value here) as variables.

    Raises:
        ValueError: a bad name, or a NAME not set here.
    """
    found = {}
    for pair in pairs:
        name, equals, value = pair.partition("=")
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"--export {pair[:40]!r}: a variable's name is letters, digits, _")
        if not equals and name not in environ:
            raise ValueError(f"--export {name}: it is not set here (give {name}=VALUE)")
        found[name] = value if equals else environ[name]
    return found
