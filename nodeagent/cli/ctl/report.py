"""nodeagentctl report (sreport): usage of the pool's ended jobs by user, queue or day, from the
accounting database (docs/accounting.md): jobs, failed, node-hours, GPU-hours, elapsed hours,
restarts and the ETTR weighted by node-hours. `--json` documents carry `"version": 1`."""

from __future__ import annotations

import argparse
import json

from nodeagent.accounting.ledger import opened
from nodeagent.cli.ctl import accounting
from nodeagent.cli.ctl.targets import Target
from nodeagent.model.accounting import BY
from nodeagent.views import accounting as views
from nodeagent.views.documents import JSON_VERSION

HELP = "usage by user, queue or day, from the accounting database (sreport)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--by", choices=BY, default="user", help="what to group by (user)")
    parser.add_argument(
        "--since",
        metavar="WHEN",
        help="only jobs that ended since WHEN: a duration ago (30d) or an RFC 3339 time",
    )
    parser.add_argument(
        "--until", metavar="WHEN", help="only jobs that ended before WHEN (as --since)"
    )
    parser.add_argument("--user", help="only the jobs that ran as this user")
    accounting.add_argument(parser)
    parser.add_argument("--json", action="store_true")


def run(target: Target, args: argparse.Namespace) -> int:
    with opened(accounting.ledger_of(target, args)) as ledger:
        doc = views.report(target.pool_store, ledger, args.by, args.since, args.until, args.user)
    if args.json:
        print(json.dumps({"version": JSON_VERSION, "pool": target.pool, **doc}, indent=2))
        return 0
    print(
        f"{args.by.upper():<24} {'JOBS':>8} {'NOT-OK':>7} {'NODE-H':>12} {'GPU-H':>12} "
        f"{'ELAPSED-H':>11} {'RESTARTS':>8} {'ETTR':>6}"
    )
    for r in doc["rows"]:
        gpu = "-" if r["gpu_hours"] is None else f"{r['gpu_hours']:.2f}"
        ettr = "-" if r["ettr"] is None else f"{100 * r['ettr']:.1f}%"
        print(
            f"{r['key'] or '-':<24} {r['jobs']:>8} {r['failed']:>7} {r['node_hours']:>12.2f} "
            f"{gpu:>12} {r['elapsed_hours']:>11.2f} {r['restarts']:>8} {ettr:>6}"
        )
    return 0
