"""`nodeagentctl stacks JOB [--rank R] [--native] [--json]`: what a live job's ranks are doing
now, as py-spy dumps them, each from the agent of its node (views/stacks.py): what a user reads
when the loss stops moving and the job is not declared hung. Only the job's user and operators
may ask (pool.auth: munge)."""

from __future__ import annotations

import argparse
import json

from nodeagent.cli.ctl import argtypes
from nodeagent.cli.ctl.logs import agent_signer
from nodeagent.cli.ctl.targets import Target
from nodeagent.errors import UsageError
from nodeagent.views import stacks as views
from nodeagent.views.logs import RankLogs

HELP = "a live job's Python stacks, every rank's (py-spy, from the agents of its nodes)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("stacks_job", metavar="JOB", type=argtypes.name)
    parser.add_argument("--rank", type=int, help="this rank alone (default: every rank)")
    parser.add_argument(
        "--native", action="store_true", help="native frames too (C, CUDA, NCCL): slower"
    )
    parser.add_argument("--json", action="store_true")


def run(target: Target, args: argparse.Namespace) -> int:
    if args.rank is not None and args.rank < 0:
        raise UsageError(f"--rank must be >= 0, got {args.rank}")
    logs = RankLogs(
        target.client, target.prefix, target.pool, args.stacks_job, agent_signer(target, args)
    )
    taken = views.take(logs, args.rank, args.native)
    if args.json:
        print(json.dumps(views.document(taken), indent=2))
    else:
        print(views.render(taken))
    return 0 if taken.ranks and not any(r.error for r in taken.ranks) else 1
