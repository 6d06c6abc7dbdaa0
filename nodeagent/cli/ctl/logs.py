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
import sys
import time
from pathlib import Path

from nodeagent.cli.ctl import argtypes
from nodeagent.cli.ctl.targets import Target, munge_socket
from nodeagent.cli.launchargs import DEFAULT_LOG_DIR
from nodeagent.config.settings import Config
from nodeagent.coord.requests import RequestStore
from nodeagent.errors import ConfigError, UsageError
from nodeagent.model.credential import MungeUnavailable
from nodeagent.supervisor.libmunge import munge_at
from nodeagent.telemetry.logserve import MAX_TAIL_LINES, Sign
from nodeagent.telemetry.logtail import Follower, last_lines, rank_logs
from nodeagent.views.logs import Line, Notice, RankLogs, read

FOLLOW_INTERVAL_S = 0.2


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


# -- logs JOB: across the pool (views/logs.py) ------------------------------------------------


def run(target: Target, args: argparse.Namespace) -> int:
    """`logs JOB`: the rank's log from the agent of the node it runs on (with pool.auth munge,
    each request signed by this host's munged)."""
    if args.log_dir is not None:
        raise UsageError("--log-dir reads this node's files: give it without JOB")
    if not 0 <= args.tail <= MAX_TAIL_LINES:
        raise UsageError(f"--tail must be within [0, {MAX_TAIL_LINES}], got {args.tail}")
    if (args.rank or 0) < 0:
        raise UsageError(f"--rank must be >= 0, got {args.rank}")
    sign = agent_signer(target, args)
    logs = RankLogs(target.client, target.prefix, target.pool, args.logs_job, sign)
    for item in read(logs, args.rank or 0, args.tail, args.follow):
        if isinstance(item, Line):
            print(item.text)
        elif isinstance(item, Notice):
            if item.text.startswith("generation "):
                print(f"=== nodeagentctl: {item.text} ===", flush=True)
            else:
                print(f"nodeagentctl: {item.text}", file=sys.stderr, flush=True)
        else:
            sys.stdout.flush()
    sys.stdout.flush()
    return 0


def agent_signer(target: Target, args: argparse.Namespace) -> Sign | None:
    """How a request to the pool's agents is signed: by this host's munged under pool.auth:
    munge (None: the pool signs nothing)."""
    if RequestStore(target.client, target.pool_store.keys).auth() != "munge":
        return None
    munge = munge_at(munge_socket(target, args))

    def sign(payload: str) -> str:
        try:
            return munge.encode(payload)
        except MungeUnavailable as exc:
            raise ConfigError(
                "--munge-socket", f"the pool's agents take MUNGE credentials, but {exc}"
            ) from None

    return sign
