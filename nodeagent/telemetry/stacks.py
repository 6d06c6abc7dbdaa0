"""A live job's stacks, taken by the agents of its nodes (`nodeagentctl stacks JOB`, GET
/v1/jobs/{job}/stacks; docs/interactive.md, "A live job's stacks").

The agent's HTTP server hands

    GET /stacks/<job>?rank=R&native=1&as_uid=U&credential=C

to a thread of its own (telemetry/httpd.Handoff: a dump takes longer than a scrape), where
`StacksRoute` has py-spy dump every rank of the job that this node's agent started (rank R
alone with `rank`; native frames too with `native=1`), all at once, each stopped only for its
own dump. The answer is JSON: `{"job", "node", "ranks": [{"rank", "pid", "stacks"} or {"rank",
"pid", "error"}]}`. The pids are the agent's own workers', never one a request names.

With pool.auth: munge the request carries a credential bound to it as a log request's is
(logserve.log_payload), of the job's user or an operator (`JobAccess`,
pool/authority.Authority.may_act); a group member of the job's user is not enough, as it is for
a log: a stack shows what the user's code holds. Without, whoever reaches the port may ask, as
for a log.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from nodeagent.model.decode import NAME_RE
from nodeagent.telemetry.logserve import (
    JSON,
    TEXT,
    LogFetchError,
    Sign,
    ask,
    log_digest,
    numbers_of,
    unsigned,
)

PREFIX = "/stacks/"
_PARAMS = ("rank", "native", "as_uid")


class JobAccess(Protocol):
    """Who may act on a job on this node (pool.auth: munge)."""

    def may_act(
        self, digest: str, credential: str, uid: int, operators: bool, as_uid: int | None = None
    ) -> str | None:
        """None when `credential` is fresh, binds the request of `digest` and names the job's
        user `uid` (or, where `operators`, an operator); else why not."""
        ...


@dataclass(frozen=True)
class RankHere:
    """A rank of the job this node's agent started, and the pid its code runs as."""

    rank: int
    pid: int


Dump = Callable[[int, bool], str]  # (pid, native) -> py-spy's dump; raises OSError with why not


@dataclass(frozen=True)
class JobHere:
    """What the route needs of a job this node serves: its user, its ranks running here, and
    how one is dumped (as its user)."""

    uid: int
    ranks: tuple[RankHere, ...]
    dump: Dump


@dataclass(frozen=True)
class StacksRequest:
    job: str
    rank: int | None = None
    native: bool = False
    as_uid: int | None = None
    credential: str = ""

    @property
    def target(self) -> str:
        query = [
            f"{name}={value}"
            for name, value in (
                ("rank", self.rank),
                ("native", 1 if self.native else None),
                ("as_uid", self.as_uid),
            )
            if value is not None
        ]
        return PREFIX + self.job + ("?" + "&".join(query) if query else "")


@dataclass(frozen=True)
class RankStacks:
    """One rank's stacks as its node's agent took them, or why it could not."""

    node: str
    rank: int
    pid: int
    stacks: str = ""
    error: str = ""


def parse(target: str) -> StacksRequest | str:
    """The request `target` asks for, or why it is a bad one. Pure."""
    path, _, query = target.partition("?")
    job = path.removeprefix(PREFIX)
    if not path.startswith(PREFIX) or not NAME_RE.fullmatch(job):
        return "expected /stacks/JOB with a valid job id"
    found = numbers_of(query, _PARAMS, "rank=R, native=1, as_uid=U")
    if isinstance(found, str):
        return found
    params, credential = found
    return StacksRequest(
        job, params.get("rank"), bool(params.get("native")), params.get("as_uid"), credential
    )


class StacksRoute:
    """GET /stacks/JOB: the stacks of the job's ranks this node runs (a handed-off route)."""

    def __init__(
        self, node: str, jobs: Callable[[str], JobHere | None], access: JobAccess | None = None
    ) -> None:
        """`jobs`: what this node's agent runs of a job (None: not here); `access`: pool.auth
        munge, who may ask (None: whoever reaches the port)."""
        self._node = node
        self._jobs = jobs
        self._access = access

    def __call__(self, target: str) -> tuple[int, bytes, str]:
        request = parse(target)
        if isinstance(request, str):
            return 400, f"{request}\n".encode(), TEXT
        if self._access is not None and not request.credential:
            return unsigned("stacks are taken", "stacks")
        job = self._jobs(request.job)
        if job is None:
            return 404, f"node {self._node} runs no job {request.job}\n".encode(), TEXT
        if self._access is not None:
            digest = log_digest(request.target)
            why = self._access.may_act(digest, request.credential, job.uid, True, request.as_uid)
            if why is not None:
                return 403, f"{why}\n".encode(), TEXT
        ranks = [r for r in job.ranks if request.rank in (None, r.rank)]
        if request.rank is not None and not ranks:
            said = f"node {self._node} runs no rank {request.rank} of job {request.job}"
            return 404, f"{said}\n".encode(), TEXT
        taken = _take(job.dump, ranks, request.native)
        body = {"job": request.job, "node": self._node, "ranks": taken}
        return 200, json.dumps(body, ensure_ascii=False).encode(), JSON


def _take(dump: Dump, ranks: Sequence[RankHere], native: bool) -> list[dict[str, object]]:
    """Each rank's dump, all at once: a dump stops its process only for its own reading."""

    def one(rank: RankHere) -> dict[str, object]:
        try:
            return {"rank": rank.rank, "pid": rank.pid, "stacks": dump(rank.pid, native)}
        except OSError as exc:
            return {"rank": rank.rank, "pid": rank.pid, "error": str(exc)}

    if not ranks:
        return []
    with ThreadPoolExecutor(len(ranks), thread_name_prefix="stacks") as pool:
        return list(pool.map(one, ranks))


def fetch(
    address: str, request: StacksRequest, timeout: float = 60.0, sign: Sign | None = None
) -> list[RankStacks]:
    """Ask the agent at `address` for the stacks of its ranks of the job (none: it runs no
    such rank).

    Raises:
        LogFetchError: unreachable, or garbage; LogRefused: an error other than 404.
    """
    body = ask(address, request.target, timeout, sign)
    if body is None:
        return []
    try:
        node = str(body["node"])
        return [
            RankStacks(
                node,
                int(one["rank"]),
                int(one["pid"]),
                str(one.get("stacks", "")),
                str(one.get("error", "")),
            )
            for one in body["ranks"]
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LogFetchError(f"it answered garbage: {exc!r}") from None
