"""A rank's log across the pool, read or followed (`nodeagentctl logs JOB`, GET
/v1/jobs/{job}/logs/{rank}): the job's record names the node of the rank (rank = group_rank *
nproc_per_node + local_rank), its report the address of that node's agent, and the agent serves
the log (telemetry/logserve.py). Following asks again from where it stopped and follows the rank
to its node of each new generation; it ends when the job does.

`read` yields what each face prints or streams: `Line`s of the log, `Notice`s (a new
generation, a node that cannot be reached now) and, while following, `Idle` after each round
with nothing new (a face's cue to check that its reader is still there).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from nodeagent.coord.client import Redis
from nodeagent.coord.keys import JobKeys, PoolKeys
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.replies import NodeLease, Snapshot
from nodeagent.coord.store import JobStore
from nodeagent.errors import NotFoundError, RefusedError, UsageError
from nodeagent.model.job import JobRecord
from nodeagent.telemetry.logserve import (
    LogChunk,
    LogFetchError,
    LogRefused,
    LogRequest,
    Sign,
    fetch,
    reachable,
)

FORBIDDEN = (401, 403)  # a node's answers that say the caller may not read the log

FOLLOW_INTERVAL_S = 0.5  # each round asks Redis where the rank is and its agent for lines


@dataclass(frozen=True)
class Line:
    text: str


@dataclass(frozen=True)
class Notice:
    text: str


@dataclass(frozen=True)
class Idle:
    pass


Item = Line | Notice | Idle


@dataclass(frozen=True)
class Place:
    """Where a rank runs in a generation, and how to reach its node's agent."""

    node: str
    address: str
    generation: int


@dataclass
class _Source:
    """What following reads: `generation` None is the rank's file across generations."""

    place: Place
    generation: int | None
    offset: int


class RankLogs:
    """The Redis reads of a job's rank logs: the job's record and its nodes' addresses; `sign`
    makes each request's credential for the agents (pool.auth: munge), None in a pool without."""

    def __init__(
        self,
        client: Redis,
        prefix: str,
        pool: str,
        job: str,
        sign: Sign | None = None,
        as_uid: int | None = None,
    ) -> None:
        """`as_uid`: the API service's socket caller, whom its MUNGE credential vouches for."""
        self.job = job
        self.sign = sign
        self.as_uid = as_uid
        self._store = JobStore(client, JobKeys(prefix, job))
        self._pool = PoolStore(client, PoolKeys(prefix, pool))
        self._where = f"key prefix {prefix!r}, pool {pool!r}"

    def locate(self, rank: int) -> tuple[JobRecord | None, Place | str]:
        """The job's record, and the place of `rank` or why it has none.

        Raises: NotFoundError: no such job."""
        snapshot, record = self._record()
        if isinstance(record, str):
            return None, record
        ranks = len(record.members) * record.nproc_per_node
        if not 0 <= rank < ranks:
            if not ranks:
                return record, f"job {self.job} has no ranks now ({record.state.value})"
            return record, (
                f"rank {rank} is out of range: job {self.job} has ranks 0-{ranks - 1} "
                f"({len(record.members)} nodes x {record.nproc_per_node}) in generation "
                f"{record.generation}"
            )
        node = record.members[rank // record.nproc_per_node]
        return record, self._place(node, record.generation, snapshot.leases)

    def members(self) -> tuple[JobRecord, list[Place | str]]:
        """The job's record, and where each of its members' agents listens or why it cannot
        be asked.

        Raises: NotFoundError: no such job; UsageError: it has no record (not started)."""
        snapshot, record = self._record()
        if isinstance(record, str):
            raise UsageError(record)
        places = [self._place(n, record.generation, snapshot.leases) for n in record.members]
        return record, places

    def _record(self) -> tuple[Snapshot, JobRecord | str]:
        """One read of the job's keys, and its record or why it has none.

        Raises: NotFoundError: no such job."""
        snapshot = self._store.snapshot()
        record = snapshot.stored_record or snapshot.record
        if record is not None:
            return snapshot, record
        status = self._pool.read().jobs.get(self.job)
        if status is None:
            raise NotFoundError(
                f"no such job {self.job!r} ({self._where}): check the id and --redis"
            )
        return (
            snapshot,
            f"job {self.job} has no ranks: it is {status.state.value} ({status.reason})",
        )

    def _place(self, node: str, generation: int, leases: Sequence[NodeLease]) -> Place | str:
        """Where the node's agent listens (its job report's address, else its pool report's),
        or why it cannot be asked."""
        reports = {lease.name: lease.report for lease in leases}
        report = reports.get(node) or self._pool.read().nodes.get(node)
        if report is None:
            return (
                f"node {node} has no live report in Redis: its agent cannot be asked for the "
                "log (read its files there: nodeagentctl logs --rank R)"
            )
        if report.metrics is None:
            return (
                f"node {node}'s agent serves no HTTP (metrics.listen: off): set metrics.listen "
                "to an address this machine can reach, or read its files there"
            )
        return Place(node, reachable(report.metrics, report.address), generation)

    def ask(self, place: Place, request: LogRequest) -> LogChunk | None:
        try:
            return fetch(place.address, replace(request, as_uid=self.as_uid), sign=self.sign)
        except LogRefused as exc:
            raise LogRefused(f"node {place.node} at {place.address}: {exc}", exc.code) from None
        except LogFetchError as exc:
            raise LogFetchError(f"node {place.node} at {place.address}: {exc}") from None


def read(
    logs: RankLogs,
    rank: int,
    tail: int,
    follow: bool,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[Item]:
    """The rank's last `tail` lines (0..MAX_TAIL_LINES, rank >= 0: the faces check their
    input), then (`follow`) what it writes until the job ends.

    Raises (before the first item):
        NotFoundError: no such job.
        RefusedError: its agent refused the caller (401, 403: not the caller's to read).
        UsageError: the rank has no place now, its agent refused or cannot be reached, or it
            has no log yet.
    """
    record, place = logs.locate(rank)
    if isinstance(place, str):
        raise UsageError(place)
    try:
        chunk = logs.ask(place, LogRequest(logs.job, rank, tail=tail))
    except LogRefused as exc:  # it answered: the refusal says it all
        if exc.code in FORBIDDEN:  # not this caller's to read: no retry changes that
            raise RefusedError(str(exc), exc.code) from None
        raise UsageError(str(exc)) from None
    except LogFetchError as exc:
        raise UsageError(f"{exc} (is its metrics.listen reachable from here?)") from None
    if chunk is None:
        raise UsageError(f"node {place.node} has no log of rank {rank} of job {logs.job} yet")
    return _items(
        logs, rank, chunk, place, follow and not (record and record.state.terminal), sleep
    )


def _items(
    logs: RankLogs,
    rank: int,
    chunk: LogChunk,
    place: Place,
    follow: bool,
    sleep: Callable[[float], None],
) -> Iterator[Item]:
    yield from (Line(line) for line in chunk.lines)
    if follow:
        yield from _follow(logs, rank, _Source(place, None, chunk.offset), sleep)


def _drain(logs: RankLogs, rank: int, source: _Source) -> Iterator[Line]:
    """What the source has from its offset on, until caught up."""
    while True:
        request = LogRequest(logs.job, rank, None, source.offset, source.generation)
        chunk = logs.ask(source.place, request)
        if chunk is None:
            return  # not there yet (a generation starting)
        yield from (Line(line) for line in chunk.lines)
        source.offset = chunk.offset
        if not chunk.lines or chunk.offset >= chunk.size:
            return


def _last(logs: RankLogs, rank: int, source: _Source) -> Iterator[Line]:
    """What is left of the source, where its node still answers."""
    with contextlib.suppress(LogFetchError):
        yield from list(_drain(logs, rank, source))


def _follow(
    logs: RankLogs, rank: int, source: _Source, sleep: Callable[[float], None]
) -> Iterator[Item]:
    said = ""
    while True:
        try:
            yield from _drain(logs, rank, source)
        except LogFetchError as exc:
            if f"{exc}; retrying" != said:
                said = f"{exc}; retrying"
                yield Notice(said)
        yield Idle()
        sleep(FOLLOW_INTERVAL_S)
        record, place = logs.locate(rank)
        if record is None or record.state.terminal:
            yield from _last(logs, rank, source)
            return
        if isinstance(place, str):
            if f"{place}; waiting" != said:
                said = f"{place}; waiting"
                yield Notice(said)
        elif place != source.place:
            yield from _last(logs, rank, source)  # the last lines of the old generation
            if source.generation is None and place.node == source.place.node:
                source = _Source(place, None, source.offset)  # its banner comes in the same file
            else:
                yield Notice(f"generation {place.generation}, rank {rank} on {place.node}")
                source = _Source(place, place.generation, 0)
