"""nodeagentctl status [JOB]: the job, its nodes and its checkpoints (views/status.py builds the
document), and its place in the pool (why it waits, was shrunk or evicted)."""

from __future__ import annotations

import argparse
import json

from nodeagent.cli.ctl import argtypes, output
from nodeagent.cli.ctl.targets import Target
from nodeagent.views.status import job_status

HELP = "show the job and its nodes"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    argtypes.job_argument(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(target: Target, args: argparse.Namespace) -> int:
    doc = job_status(target.store, target.pool_store)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        output.print_status(doc)
    return 0
