"""nodeagentctl health [--node NAME]: a node's GPU verdicts as its agent last reported them
(default: the node of --config)."""

from __future__ import annotations

import argparse

from nodeagent.cli.ctl import argtypes, output
from nodeagent.cli.ctl.targets import Target
from nodeagent.errors import UsageError
from nodeagent.views.status import node_health

HELP = "a node's GPU verdicts (default: this node)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--node", type=argtypes.name, help="node name (default: node.name of --config)"
    )
    parser.add_argument("--json", action="store_true")


def run(target: Target, args: argparse.Namespace) -> int:
    store, config = target.store, target.config
    name = args.node or (config.node.name if config else None)
    if name is None:
        raise UsageError("give --node NAME, or --config of the node")
    output.print_health(name, node_health(store, name), args.json)
    return 0
