"""nodeagentctl drain NODE: cordon a node and take it out of its job now (its workers get the
stop grace and checkpoint); --wait until the job went on without it."""

from __future__ import annotations

import argparse
from typing import Any

from nodeagent.cli.ctl import argtypes, caller, cordons, wait
from nodeagent.cli.ctl.targets import Target
from nodeagent.model.job import Cordon
from nodeagent.model.request import Verb

HELP = "cordon a node and take it out of the job now (its workers checkpoint)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("node", type=argtypes.name)
    parser.add_argument("--reason", default="drained by an operator")
    parser.add_argument("--wait", action="store_true", help="wait until its workers are stopped")
    argtypes.timeout(parser)


def request(args: argparse.Namespace, user: str, job: str | None) -> tuple[Verb, dict[str, Any]]:
    return cordons.request(args, job)


def run(target: Target, args: argparse.Namespace) -> int:
    if target.job is None:
        return cordons.in_pool(target, args, caller.by())
    store = cordons.in_job(target, args.node)
    store.cordon(args.node, Cordon(reason=args.reason, by=caller.by(), drain=True))
    target.confirm("the drain")
    print(f"node {args.node}: drained ({args.reason})")
    return wait.wait_job_drained(store, args.node, args.timeout) if args.wait else 0
