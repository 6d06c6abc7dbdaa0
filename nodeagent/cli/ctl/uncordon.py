"""nodeagentctl uncordon NODE: let a cordoned or drained node take part again (0 also when it
was not cordoned: nothing to do)."""

from __future__ import annotations

import argparse
from typing import Any

from nodeagent.cli.ctl import argtypes, caller, checks, cordons
from nodeagent.cli.ctl.targets import Target
from nodeagent.model.request import Verb

HELP = "let a node take part again"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("node", type=argtypes.name)


def request(args: argparse.Namespace, user: str, job: str | None) -> tuple[Verb, dict[str, Any]]:
    return cordons.request(args, job)


def run(target: Target, args: argparse.Namespace) -> int:
    if target.job is None:
        return cordons.in_pool(target, args, caller.by())
    store = target.store
    snapshot = store.snapshot()
    checks.require_job(store, snapshot)
    cordoned = set(store.cordons())
    checks.require_node(store, snapshot, args.node, cordoned)
    if args.node not in cordoned:
        print(f"node {args.node}: was not cordoned")
        return 0
    lifted = store.uncordon(args.node, by=caller.by())
    target.confirm("the uncordon")
    print(f"node {args.node}: " + ("uncordoned" if lifted else "was not cordoned"))
    return 0
