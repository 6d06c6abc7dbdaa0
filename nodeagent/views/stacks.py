"""A live job's stacks across the pool (`nodeagentctl stacks JOB`, GET /v1/jobs/{job}/stacks):
the job's record names its nodes, their reports the address of each node's agent, and each
agent dumps the ranks it runs (telemetry/stacks.py), every node asked at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from nodeagent.errors import RefusedError, UsageError
from nodeagent.telemetry.logserve import LogFetchError, LogRefused
from nodeagent.telemetry.stacks import RankStacks, StacksRequest, fetch
from nodeagent.views.logs import FORBIDDEN, Place, RankLogs


@dataclass(frozen=True)
class JobStacks:
    """Every rank's stacks the nodes gave, by rank, and what could not be asked or answered."""

    job: str
    generation: int
    ranks: tuple[RankStacks, ...]
    unreachable: tuple[str, ...]


def take(logs: RankLogs, rank: int | None = None, native: bool = False) -> JobStacks:
    """The stacks of the job's ranks (`rank`: that one alone), from the agents of its nodes.

    Raises:
        NotFoundError: no such job.
        RefusedError: an agent refused the caller (401, 403: not the caller's job).
        UsageError: the job has no ranks now, or the rank is out of its range.
    """
    if rank is None:
        record, places = logs.members()
    else:
        found, place = logs.locate(rank)
        if isinstance(place, str):
            raise UsageError(place)
        assert found is not None
        record, places = found, [place]
    request = StacksRequest(logs.job, rank, native, logs.as_uid)
    asked = [p for p in places if isinstance(p, Place)]
    with ThreadPoolExecutor(max(1, len(asked)), thread_name_prefix="stacks") as pool:
        answers = list(pool.map(lambda p: _ask(logs, p, request), asked))
    ranks = sorted((r for a in answers if not isinstance(a, str) for r in a), key=lambda r: r.rank)
    unreachable = [p for p in places if isinstance(p, str)]
    unreachable += [a for a in answers if isinstance(a, str)]
    return JobStacks(logs.job, record.generation, tuple(ranks), tuple(unreachable))


def _ask(logs: RankLogs, place: Place, request: StacksRequest) -> Sequence[RankStacks] | str:
    try:
        return fetch(place.address, request, sign=logs.sign)
    except LogRefused as exc:
        if exc.code in FORBIDDEN:
            raise RefusedError(f"node {place.node}: {exc}", exc.code) from None
        return f"node {place.node} at {place.address}: {exc}"
    except LogFetchError as exc:
        return f"node {place.node} at {place.address}: {exc}"


def render(stacks: JobStacks) -> str:
    """The text a terminal shows: each rank's dump under a header, then what was missed."""
    out = []
    for one in stacks.ranks:
        out.append(f"=== rank {one.rank} on {one.node} (pid {one.pid}) ===")
        out.append(one.stacks.rstrip("\n") if not one.error else f"(no stacks: {one.error})")
    out.extend(f"(not asked: {why})" for why in stacks.unreachable)
    if not stacks.ranks and not stacks.unreachable:
        out.append(f"job {stacks.job} runs no rank now")
    return "\n".join(out)


def document(stacks: JobStacks) -> dict[str, object]:
    """The JSON both faces give."""
    return {
        "version": 1,
        "job": stacks.job,
        "generation": stacks.generation,
        "ranks": [
            {"rank": r.rank, "node": r.node, "pid": r.pid, "stacks": r.stacks, "error": r.error}
            for r in stacks.ranks
        ],
        "unreachable": list(stacks.unreachable),
    }
