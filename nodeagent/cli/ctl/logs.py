"""`nodeagentctl logs [JOB] [--rank R] [--follow] [--tail N]`: a job's rank logs.

With JOB, across the pool: the job's record names the node of rank R (default 0; rank =
group_rank * nproc_per_node + local_rank), its report the address of that node's agent, and the
agent serves the log (GET /logs/JOB/RANK, nodeagent.telemetry.logserve). `--follow` asks again
from where it stopped and follows the rank to its node of each new generation; it ends when the
job does.

Without JOB, this node's files, no Redis: `<log_dir>/<job>/rank-R.log` (each rank's output
across generations, a banner line before each generation). log_dir and the job come from
--config, else --log-dir (default ./nodeagent-logs, where `nodeagent launch` writes) and --job
(default: the only job there). A rank with no log here exits 2.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nodeagent.cli.ctl import argtypes
from nodeagent.cli.ctl.targets import Target, munge_socket
from nodeagent.cli.launchargs import DEFAULT_LOG_DIR
from nodeagent.config.settings import Config
from nodeagent.coord.client import Redis
from nodeagent.coord.keys import JobKeys, PoolKeys
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.replies import NodeLease
from nodeagent.coord.requests import RequestStore
from nodeagent.coord.store import JobStore
from nodeagent.errors import ConfigError, NotFoundError, UsageError
from nodeagent.model.credential import Munge, MungeUnavailable
from nodeagent.model.job import JobRecord
from nodeagent.supervisor.munge import MungeProgram
from nodeagent.telemetry.logserve import (
    MAX_TAIL_LINES,
    LogChunk,
    LogFetchError,
    LogRefused,
    LogRequest,
    Sign,
    fetch,
    reachable,
)
from nodeagent.telemetry.logtail import Follower, last_lines, rank_logs

FOLLOW_INTERVAL_S = 0.2
POOL_FOLLOW_INTERVAL_S = 0.5  # each round asks Redis where the rank is and its agent for lines


HELP = (
    "a rank's log, the last lines or followed: logs JOB across the pool (from the agent of the "
    "rank's node), or without JOB this node's files (no Redis)"
)


def add_arguments(logs: argparse.ArgumentParser) -> None:
    logs.add_argument(
        "logs_job",
        nargs="?",
        metavar="JOB",
        type=argtypes.name,
        help="the job: read the rank's log from its node's agent, wherever it runs; without "
        "JOB: this node's rank logs (--config, or --log-dir and --job)",
    )
    logs.add_argument(
        "--rank",
        type=int,
        help="one rank (with JOB default 0; without JOB every rank with a log here)",
    )
    logs.add_argument("--tail", "-n", type=int, default=20, help="last lines (default 20)")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing new lines")
    logs.add_argument("--log-dir", help=f"without --config: default ./{DEFAULT_LOG_DIR}")


def _job_dir(config: Config | None, args: argparse.Namespace) -> Path:
    log_dir = Path(args.log_dir or (config.log_dir if config else DEFAULT_LOG_DIR))
    job = args.job or (config.job.id if config else None)
    if job is None:
        jobs = sorted(p.name for p in log_dir.glob("*") if rank_logs(p)) if log_dir.is_dir() else []
        if len(jobs) != 1:
            found = f"jobs there: {', '.join(jobs)}" if jobs else "no job logs there"
            raise UsageError(f"give --job or --config ({log_dir}: {found})")
        job = jobs[0]
    return log_dir / job


def run_here(config: Config | None, args: argparse.Namespace) -> int:
    """`logs` without JOB: this node's files, no Redis (nodeagentctl runs it before it connects)."""
    if args.tail < 0:
        raise UsageError(f"--tail must be >= 0, got {args.tail}")
    job_dir = _job_dir(config, args)
    logs = rank_logs(job_dir)
    if args.rank is not None:
        if args.rank not in logs:
            ranks = ", ".join(map(str, logs)) or "none"
            raise UsageError(
                f"rank {args.rank} has no log in {job_dir} on this node (ranks: {ranks})"
            )
        logs = {args.rank: logs[args.rank]}
    if not logs:
        raise UsageError(f"no rank logs in {job_dir} on this node")
    headers = len(logs) > 1
    followers = []
    for rank, path in logs.items():
        lines, size = last_lines(path, args.tail)
        if headers:
            print(f"==> rank {rank}: {path} <==")
        for line in lines:
            print(line)
        followers.append((rank, Follower(path, size)))
    sys.stdout.flush()
    while args.follow:
        for rank, follower in followers:
            for line in follower.read():
                print(f"[rank {rank}] {line}" if headers else line, flush=True)
        time.sleep(FOLLOW_INTERVAL_S)
    return 0


# -- logs JOB: across the pool --------------------------------------------------------------


@dataclass(frozen=True)
class Place:
    """Where a rank runs in a generation, and how to reach its node's agent."""

    node: str
    address: str
    generation: int


@dataclass
class _Source:
    """What `--follow` reads: `generation` None is the rank's file across generations."""

    place: Place
    generation: int | None
    offset: int


class _Pool:
    """The Redis reads of `logs JOB`: the job's record and its nodes' addresses."""

    def __init__(
        self, client: Redis, prefix: str, pool: str, job: str, sign: Sign | None = None
    ) -> None:
        self.job = job
        self.sign = sign  # pool.auth munge: each request to an agent carries a credential
        self._store = JobStore(client, JobKeys(prefix, job))
        self._pool = PoolStore(client, PoolKeys(prefix, pool))
        self._where = f"key prefix {prefix!r}, pool {pool!r}"

    def munge_pool(self) -> bool:
        return RequestStore(self._pool.client, self._pool.keys).auth() == "munge"

    def locate(self, rank: int) -> tuple[JobRecord | None, Place | str]:
        """The job's record, and the place of `rank` or why it has none.

        Raises: NotFoundError: no such job (nodeagentctl exits 3)."""
        snapshot = self._store.snapshot()
        record = snapshot.stored_record or snapshot.record
        if record is None:
            status = self._pool.read().jobs.get(self.job)
            if status is None:
                raise NotFoundError(
                    f"no such job {self.job!r} ({self._where}): check the id and --redis"
                )
            return (
                None,
                f"job {self.job} has no ranks: it is {status.state.value} ({status.reason})",
            )
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


def _ask(place: Place, request: LogRequest, sign: Sign | None) -> LogChunk | None:
    try:
        return fetch(place.address, request, sign=sign)
    except LogFetchError as exc:  # of the same kind: refused, or not reached
        raise type(exc)(f"node {place.node} at {place.address}: {exc}") from None


def _drain(pool: _Pool, rank: int, source: _Source) -> None:
    """Print what the source has from its offset on, until caught up."""
    while True:
        request = LogRequest(pool.job, rank, None, source.offset, source.generation)
        chunk = _ask(source.place, request, pool.sign)
        if chunk is None:
            return  # not there yet (a generation starting)
        for line in chunk.lines:
            print(line)
        sys.stdout.flush()
        source.offset = chunk.offset
        if not chunk.lines or chunk.offset >= chunk.size:
            return


def _moved(source: _Source, place: Place, rank: int) -> _Source:
    """What to read once the rank's generation is `place`'s: the same file on the same node,
    else that generation's file on its node from the start."""
    if source.generation is None and place.node == source.place.node:
        return _Source(place, None, source.offset)  # its banner comes in the same file
    print(f"=== nodeagentctl: generation {place.generation}, rank {rank} on {place.node} ===")
    return _Source(place, place.generation, 0)


def _follow(pool: _Pool, rank: int, source: _Source) -> int:
    said = ""
    while True:
        try:
            _drain(pool, rank, source)
        except LogFetchError as exc:
            said = _say_once(f"{exc}; retrying", said)
        time.sleep(POOL_FOLLOW_INTERVAL_S)
        record, place = pool.locate(rank)
        if record is None or record.state.terminal:
            with contextlib.suppress(LogFetchError):
                _drain(pool, rank, source)
            return 0
        if isinstance(place, str):
            said = _say_once(f"{place}; waiting", said)
        elif place != source.place:
            with contextlib.suppress(LogFetchError):  # the last lines of the old generation
                _drain(pool, rank, source)
            source = _moved(source, place, rank)


def _say_once(message: str, said: str) -> str:
    if message != said:
        print(f"nodeagentctl: {message}", file=sys.stderr, flush=True)
    return message


def run(target: Target, args: argparse.Namespace) -> int:
    """`logs JOB`: the rank's log from the agent of the node it runs on (with pool.auth munge,
    each request signed by this host's munged)."""
    munge = MungeProgram(munge_socket(target, args))
    return _from_pool(target.client, target.prefix, target.pool, args, munge)


def _from_pool(
    client: Redis, prefix: str, pool_name: str, args: argparse.Namespace, munge: Munge
) -> int:
    if args.log_dir is not None:
        raise UsageError("--log-dir reads this node's files: give it without JOB")
    if not 0 <= args.tail <= MAX_TAIL_LINES:
        raise UsageError(f"--tail must be within [0, {MAX_TAIL_LINES}], got {args.tail}")
    rank = args.rank or 0
    if rank < 0:
        raise UsageError(f"--rank must be >= 0, got {rank}")
    pool = _Pool(client, prefix, pool_name, args.logs_job)
    if pool.munge_pool():
        pool.sign = _signer(munge)
    record, place = pool.locate(rank)
    if isinstance(place, str):
        raise UsageError(place)
    try:
        chunk = _ask(place, LogRequest(pool.job, rank, tail=args.tail), pool.sign)
    except LogRefused as exc:  # it answered: the refusal says it all
        raise UsageError(str(exc)) from None
    except LogFetchError as exc:
        raise UsageError(f"{exc} (is its metrics.listen reachable from here?)") from None
    if chunk is None:
        raise UsageError(f"node {place.node} has no log of rank {rank} of job {pool.job} yet")
    for line in chunk.lines:
        print(line)
    sys.stdout.flush()
    if not args.follow or (record is not None and record.state.terminal):
        return 0
    return _follow(pool, rank, _Source(place, None, chunk.offset))


def _signer(munge: Munge) -> Sign:
    def sign(payload: str) -> str:
        try:
            return munge.encode(payload)
        except MungeUnavailable as exc:
            raise ConfigError(
                "--munge-socket", f"the pool's agents serve logs to MUNGE credentials, but {exc}"
            ) from None

    return sign
