"""nodeagentctl status [JOB]: the job, its nodes and its checkpoints (cli/status.py builds the
document), and its place in the pool (why it waits, was shrunk or evicted)."""

from __future__ import annotations

import argparse
import json

from nodeagent.cli.ctl import argtypes, output
from nodeagent.cli.ctl.targets import Target
from nodeagent.cli.status import status_document

HELP = "show the job and its nodes"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    argtypes.job_argument(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(target: Target, args: argparse.Namespace) -> int:
    store = target.store
    snapshot = store.snapshot()
    doc = {
        "version": output.JSON_VERSION,
        **status_document(snapshot, store.keys.job, store.speeds(), store.slow_verdicts()),
    }
    pooled = target.pool_store.status(store.keys.job)
    doc["pool"] = (
        {"pool": target.pool, "state": pooled.state.value, "reason": pooled.reason}
        if pooled is not None
        else None
    )
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        output.print_status(doc)
    return 0
