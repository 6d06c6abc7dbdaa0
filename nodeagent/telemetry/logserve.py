"""A rank's log across the pool: served by the agent of the node it runs on, read by
`nodeagentctl logs JOB` (docs/pool.md, "Logs of a job's ranks").

The agent's HTTP server (the one of /metrics, nodeagent.telemetry.metrics.MetricsServer) answers

    GET /logs/<job>/<rank>?tail=N                  the last N lines (default 20)
    GET /logs/<job>/<rank>?offset=B                the whole lines from byte B on
    ... &generation=G                              of that generation's file

from `<log_dir>/<job>/rank-R.log` (the rank's output on this node across generations, a banner
line before each) or, with `generation`, `<log_dir>/<job>/<G>/rank-R.log`, as JSON:
`{"job", "rank", "generation", "lines": [...], "offset": where the next read starts, "size"}`.
Nothing else is read: the job id must be a valid id and the rank and numbers digits (no `..`,
no `/`, no `%` decoding), the job's directory a real directory (not a link) and the log a
regular file opened without following links. A node serves only jobs it has run (those with a
directory under its log_dir): anything else is 404. A response carries at most MAX_BYTES of log
and MAX_TAIL_LINES lines; a follower asks again from the offset it got.

With pool.auth: munge a request carries `credential=<MUNGE credential>` as its last parameter,
bound to the rest of the request (`log_payload`); the route answers only a credential of the
job's user (its group owns the log: whoever may read it on the node) or of an operator (401
without one, 403 for another user's; `LogAccess`, pool/authority.Authority).

Training output never goes through Redis: it can be gigabytes, and Redis memory is the pool's.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from nodeagent.errors import NodeagentError
from nodeagent.model.credential import bound, digest_of
from nodeagent.model.decode import NAME_RE

MAX_BYTES = 1 << 20  # of log in one response
MAX_TAIL_LINES = 10_000
DEFAULT_TAIL = 20
BLOCK = 65536
_NUMBER = re.compile(r"[0-9]{1,15}")
_PARAMS = ("tail", "offset", "generation", "as_uid")
# a MUNGE credential, or an API token's (model/token.py: token1.<claims>.<time>.<proof>)
CREDENTIAL_RE = re.compile(
    r"MUNGE:[A-Za-z0-9+/=]{1,4000}:|token1\.[A-Za-z0-9_-]{1,1000}\.[0-9]{1,12}\.[0-9a-f]{64}"
)
JSON = "application/json"
TEXT = "text/plain"
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no http_proxy


class LogFetchError(NodeagentError):
    """A node's agent could not be asked for a log (unreachable, or it answered an error)."""


class LogRefused(LogFetchError):
    """The node's agent answered, with an error (a refusal: 401, 403, ...): `code`."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


class LogAccess(Protocol):
    """Who may read a log over HTTP (pool.auth: munge)."""

    def may_read(
        self, digest: str, credential: str, gid: int, as_uid: int | None = None
    ) -> str | None:
        """None when `credential` is fresh, binds the request of `digest`, and names an
        operator or a member of group `gid` (the log's); else why not. `as_uid`: the API
        service's socket caller its credential vouches for (pool.api_users)."""
        ...


Sign = Callable[[str], str]  # a payload (log_payload) -> a credential carrying it


def log_digest(target: str) -> str:
    """What a log request's credential binds: the digest of `GET <target>`, its target
    without the credential."""
    return digest_of(f"GET {target}".encode())


def log_payload(target: str) -> str:
    return bound(log_digest(target))


@dataclass(frozen=True)
class LogRequest:
    """One request: `tail` lines, or what follows byte `offset`; generation None: the rank's
    file across generations."""

    job: str
    rank: int
    tail: int | None = DEFAULT_TAIL
    offset: int | None = None
    generation: int | None = None
    credential: str = ""
    as_uid: int | None = None  # the API service asks for its socket caller (may_read)

    @property
    def target(self) -> str:
        query = [
            f"{name}={value}"
            for name, value in (
                ("tail", self.tail),
                ("offset", self.offset),
                ("generation", self.generation),
                ("as_uid", self.as_uid),
            )
            if value is not None
        ]
        return f"/logs/{self.job}/{self.rank}" + ("?" + "&".join(query) if query else "")


@dataclass(frozen=True)
class LogChunk:
    """Lines of a log; `offset`: where the next read starts; `size`: the file's size then."""

    lines: tuple[str, ...]
    offset: int
    size: int


def parse(target: str) -> LogRequest | str:
    """The request `target` asks for, or why it is a bad one. Pure."""
    path, _, query = target.partition("?")
    parts = path.split("/")
    if len(parts) != 4 or parts[:2] != ["", "logs"]:
        return "expected /logs/JOB/RANK"
    job, rank = parts[2], parts[3]
    if not NAME_RE.fullmatch(job):
        return "bad job id"
    if not _NUMBER.fullmatch(rank):
        return "bad rank: digits only"
    found = numbers_of(query, _PARAMS, "tail=N, offset=B, generation=G, as_uid=U")
    if isinstance(found, str):
        return found
    params, credential = found
    if "tail" in params and "offset" in params:
        return "tail and offset exclude each other"
    tail = params.get("tail", None if "offset" in params else DEFAULT_TAIL)
    if tail is not None and tail > MAX_TAIL_LINES:
        return f"tail: at most {MAX_TAIL_LINES} lines"
    return LogRequest(
        job,
        int(rank),
        tail,
        params.get("offset"),
        params.get("generation"),
        credential,
        params.get("as_uid"),
    )


def numbers_of(
    query: str, names: tuple[str, ...], expected: str
) -> tuple[dict[str, int], str] | str:
    """A request's numeric parameters (each of `names`, at most once) and its credential (the
    last parameter, if any), or why they are bad (`expected`: what would be right). Pure."""
    pairs = query.split("&") if query else []
    credential = ""
    if pairs and pairs[-1].startswith("credential="):
        credential = pairs.pop().partition("=")[2]
        if not CREDENTIAL_RE.fullmatch(credential):
            return "bad credential: expected a MUNGE credential or an API token's"
    params: dict[str, int] = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in names or name in params or not _NUMBER.fullmatch(value):
            return f"bad parameter {pair[:40]!r}: expected {expected}"
        params[name] = int(value)
    return params, credential


def unsigned(what: str, verb: str) -> tuple[int, bytes, str]:
    """The 401 of a request without a credential where the pool signs them."""
    said = f"{what} for the job's user or an operator: nodeagentctl {verb} signs its requests"
    return 401, f"{said} with MUNGE (pool.auth: munge)\n".encode(), TEXT


def _open(path: Path) -> int:
    """A descriptor of the regular file `path`, not following a link. Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileNotFoundError(path)
    return fd


def _lines(data: bytes) -> tuple[str, ...]:
    return tuple(data.decode("utf-8", "replace").splitlines())


def read_tail(path: Path, count: int, cap: int = MAX_BYTES) -> LogChunk:
    """The last `count` whole lines of `path` within its last `cap` bytes; the offset is the
    end of the last whole line (a line still being written comes with the next read). Raises
    OSError."""
    fd = _open(path)
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        data, start = b"", size
        while start > 0 and data.count(b"\n") <= count and size - start < cap:
            before, start = start, max(0, start - BLOCK, size - cap)
            data = os.pread(fd, before - start, start) + data
    finally:
        os.close(fd)
    if start > 0:  # the first line read may be the end of a longer one
        data = data.partition(b"\n")[2]
    whole = data[: data.rfind(b"\n") + 1]
    lines = _lines(whole)
    return LogChunk(lines[-count:] if count else (), size - (len(data) - len(whole)), size)


def read_from(path: Path, offset: int, cap: int = MAX_BYTES) -> LogChunk:
    """The whole lines from byte `offset` (a truncated file: from its start), at most `cap`
    bytes; a line longer than `cap` comes in pieces. Raises OSError."""
    fd = _open(path)
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        offset = 0 if size < offset else offset
        data = os.pread(fd, min(cap, size - offset), offset)
    finally:
        os.close(fd)
    end = data.rfind(b"\n") + 1
    if end == 0 and len(data) < cap:  # a line still being written: wait for its end
        return LogChunk((), offset, size)
    whole = data[:end] if end else data
    return LogChunk(_lines(whole), offset + len(whole), size)


class LogRoute:
    """The /logs route of the agent's HTTP server: rank logs under `log_dir`, read-only."""

    def __init__(self, log_dir: str | Path, node: str, access: LogAccess | None = None) -> None:
        """`access`: pool.auth munge, who may read which log (None: whoever reaches the port)."""
        self._log_dir = Path(log_dir)
        self._node = node
        self._access = access

    def __call__(self, target: str) -> tuple[int, bytes, str]:
        request = parse(target)
        if isinstance(request, str):
            return 400, f"{request}\n".encode(), TEXT
        if self._access is not None and not request.credential:
            return unsigned("a log is served", "logs")
        job_dir = self._log_dir / request.job
        directory = job_dir if request.generation is None else job_dir / str(request.generation)
        missing = (
            404,
            f"node {self._node} has no log of rank {request.rank} of job {request.job}\n".encode(),
            TEXT,
        )
        try:
            if not all(stat.S_ISDIR(os.lstat(d).st_mode) for d in {job_dir, directory}):
                return missing  # not a job this node ran, or a link
            path = directory / f"rank-{request.rank}.log"
            if self._access is not None:
                gid = os.lstat(path).st_gid
                digest = log_digest(request.target)
                why = self._access.may_read(digest, request.credential, gid, request.as_uid)
                if why is not None:
                    return 403, f"{why}\n".encode(), TEXT
            if request.offset is not None:
                chunk = read_from(path, request.offset)
            else:
                chunk = read_tail(path, request.tail or 0)
        except FileNotFoundError:
            return missing
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a link where the log should be
                return missing
            return 500, f"cannot read the log: {exc.strerror}\n".encode(), TEXT
        body = {
            "job": request.job,
            "rank": request.rank,
            "generation": request.generation,
            "node": self._node,
            "lines": chunk.lines,
            "offset": chunk.offset,
            "size": chunk.size,
        }
        return 200, json.dumps(body, ensure_ascii=False).encode(), JSON


def reachable(metrics: str, node_address: str) -> str:
    """Where to reach an agent that listens on `metrics` ("host:port"): a wildcard host
    (0.0.0.0, ::) is replaced by the node's published address. Pure."""
    host, _, port = metrics.rpartition(":")
    if host.strip("[]") in ("0.0.0.0", "::", ""):
        host = f"[{node_address}]" if ":" in node_address else node_address
    return f"{host}:{port}"


def fetch(
    address: str, request: LogRequest, timeout: float = 5.0, sign: Sign | None = None
) -> LogChunk | None:
    """Ask the agent at `address` ("host:port"), with a credential from `sign` where given
    (pool.auth: munge); None: it has no such log (404).

    Raises:
        LogFetchError: unreachable; LogRefused: an answer other than the log or 404.
    """
    body = ask(address, request.target, timeout, sign)
    if body is None:
        return None
    try:
        return LogChunk(tuple(map(str, body["lines"])), int(body["offset"]), int(body["size"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise LogFetchError(f"it answered garbage: {exc}") from None


def ask(address: str, target: str, timeout: float, sign: Sign | None = None) -> Any:
    """The JSON answer of the agent at `address` to `GET target`, signed by `sign` where given
    (its credential the last parameter); None: it answered 404.

    Raises:
        LogFetchError: unreachable, or not JSON; LogRefused: an error other than 404.
    """
    if sign is not None:
        target += ("&" if "?" in target else "?") + f"credential={sign(log_payload(target))}"
    try:
        with _DIRECT.open(f"http://{address}{target}", timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        detail = exc.read(300).decode("utf-8", "replace").strip()
        raise LogRefused(f"it answered {exc.code}: {detail}", exc.code) from None
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise LogFetchError(f"unreachable: {reason}") from None
