"""`nodeagentctl logs [--rank R] [--follow] [--tail N]`: the job's rank logs on this node.

Reads `<log_dir>/<job>/rank-R.log` (each rank's output across generations, a banner line before
each generation) from the node it runs on; no Redis. log_dir and the job come from --config,
else --log-dir (default ./nodeagent-logs, where `nodeagent launch` writes) and --job (default:
the only job there). A rank with no log here exits 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from nodeagent.config import Config
from nodeagent.errors import UsageError
from nodeagent.launchargs import DEFAULT_LOG_DIR
from nodeagent.logtail import Follower, last_lines, rank_logs

FOLLOW_INTERVAL_S = 0.2


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    logs = commands.add_parser(
        "logs", help="a job's rank logs on this node (no Redis): the last lines, or follow them"
    )
    logs.add_argument("--rank", type=int, help="one rank (default: every rank with a log here)")
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


def run(config: Config | None, args: argparse.Namespace) -> int:
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
