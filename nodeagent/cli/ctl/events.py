"""nodeagentctl events [JOB]: the job's event log, or with --pool the pool's (submissions,
requests and who made them, placements, preemptions, queue and cordon changes); --follow keeps
printing new ones."""

from __future__ import annotations

import argparse

from nodeagent.cli.ctl import argtypes, output
from nodeagent.cli.ctl.targets import Target
from nodeagent.coord import eventlog
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.store import JobStore

HELP = "show the job's event log"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    argtypes.job_argument(parser)
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument(
        "--last", type=argtypes.count, default=50, help="how many past events (default 50)"
    )
    parser.add_argument(
        "--pool",
        dest="pool_stream",
        action="store_true",
        help="the pool's events (who submitted, cancelled, drained what) instead of a job's",
    )


def run(target: Target, args: argparse.Namespace) -> int:
    store: JobStore | PoolStore = target.pool_store if args.pool_stream else target.store
    show = output.event_json if args.json else output.event_line
    last = eventlog.tail(store, args.last) if args.last > 0 else []
    for entry_id, fields in last:
        print(show(entry_id, fields), flush=True)
    cursor = last[-1][0] if last else store.last_event_id()
    while args.follow:
        for _, entry_id, fields in store.wait_events({store.keys.events: cursor}, 2000):
            cursor = entry_id
            print(show(entry_id, fields), flush=True)
    return 0
