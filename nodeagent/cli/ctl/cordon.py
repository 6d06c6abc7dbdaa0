"""nodeagentctl cordon NODE: keep a node out of the next generations of its job (--job), or
out of the pool's placements (no job)."""

from __future__ import annotations

import argparse
from typing import Any

from nodeagent.cli.ctl import argtypes, caller, cordons
from nodeagent.cli.ctl.targets import Target
from nodeagent.model.job import Cordon
from nodeagent.model.request import Verb

HELP = "keep a node out of the next generations"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("node", type=argtypes.name)
    parser.add_argument("--reason", default="cordoned by an operator")


def request(args: argparse.Namespace, user: str, job: str | None) -> tuple[Verb, dict[str, Any]]:
    return cordons.request(args, job)


def run(target: Target, args: argparse.Namespace) -> int:
    if target.job is None:
        return cordons.in_pool(target, args, caller.by())
    store = cordons.in_job(target, args.node)
    store.cordon(args.node, Cordon(reason=args.reason, by=caller.by()))
    target.confirm("the cordon")
    print(f"node {args.node}: cordoned ({args.reason})")
    return 0
