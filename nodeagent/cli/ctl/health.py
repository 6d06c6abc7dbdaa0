"""nodeagentctl health [--node NAME] [--job JOB]: a node's GPU verdicts as its agent last
reported them (default: the node of --config): in the job named, else in the pool."""

from __future__ import annotations

import argparse

from nodeagent.cli.ctl import argtypes, output
from nodeagent.cli.ctl.targets import Target
from nodeagent.errors import UsageError
from nodeagent.views.nodes import pool_node_health
from nodeagent.views.status import node_health

HELP = "a node's GPU verdicts (default: this node)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--node", type=argtypes.name, help="node name (default: node.name of --config)"
    )
    parser.add_argument("--json", action="store_true")


def run(target: Target, args: argparse.Namespace) -> int:
    """The node's verdicts in its job (--job, or its config's job: section), else as its pool
    heartbeat says them, whatever job it serves or none."""
    config = target.config
    name = args.node or (config.node.name if config else None)
    if name is None:
        raise UsageError("give --node NAME, or --config of the node")
    found = (
        node_health(target.store, name) if target.job else pool_node_health(target.pool_store, name)
    )
    output.print_health(name, found, args.json)
    return 0
