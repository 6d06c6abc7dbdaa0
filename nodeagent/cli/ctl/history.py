"""nodeagentctl history (sacct): the ended jobs the pool keeps (pool.keep_ended), and those
the accounting database keeps beyond it (docs/accounting.md), with their user, elapsed time,
nodes, node-hours, exit code and effective training time ratio (ETTR: the pool leader accounts
it from the job's events as it ends, model/goodput.py). `--json` documents carry
`"version": 1`."""

from __future__ import annotations

import argparse
import json

from nodeagent.accounting.ledger import opened
from nodeagent.cli.ctl import accounting
from nodeagent.cli.ctl.argtypes import count
from nodeagent.cli.ctl.targets import Target
from nodeagent.config.values import format_duration
from nodeagent.model.pool import PoolJobState
from nodeagent.views import accounting as views
from nodeagent.views.accounting import HISTORY_LIMIT
from nodeagent.views.documents import listing

HELP = "the ended jobs, with the accounting database's: user, elapsed, nodes, node-hours, ETTR"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--since",
        metavar="WHEN",
        help="only jobs that ended since WHEN: a duration ago (2h, 7d) or an RFC 3339 time",
    )
    parser.add_argument("--user", help="only the jobs that ran as this user")
    ended = [s.value for s in PoolJobState if s.ended]
    parser.add_argument("--state", choices=ended, help="only the jobs that ended so")
    parser.add_argument(
        "--limit",
        type=count,
        default=HISTORY_LIMIT,
        help=f"at most this many runs from the accounting database, the newest "
        f"(default {HISTORY_LIMIT})",
    )
    accounting.add_argument(parser)
    parser.add_argument("--json", action="store_true")


def run(target: Target, args: argparse.Namespace) -> int:
    store = target.pool_store
    with opened(accounting.ledger_of(target, args)) as ledger:
        rows = views.history(store, ledger, args.since, args.user, args.state, args.limit)
    if args.json:
        print(json.dumps(listing("jobs", store.keys.pool, rows), indent=2))
        return 0
    print(
        f"{'JOB':<24} {'USER':<12} {'STATE':<10} {'ENDED':<25} {'ELAPSED':>9} {'NODES':>5} "
        f"{'NODE-H':>8} {'GPU-H':>8} {'EXIT':>4} {'ETTR':>6}"
    )
    for r in rows:
        elapsed = format_duration(r["elapsed_s"]) if r["elapsed_s"] is not None else "-"
        gpu = "-" if r["gpu_hours"] is None else f"{r['gpu_hours']:.2f}"
        print(
            f"{r['job']:<24} {r['user'] or '-':<12} {r['state']:<10} {r['ended'] or '-':<25} "
            f"{elapsed:>9} {r['nodes']:>5} {r['node_hours']:>8.2f} {gpu:>8} "
            f"{r['exit_code']!s:>4} {_percent(r['ettr']):>6}"
        )
    return 0


def _percent(ratio: float | None) -> str:
    return "-" if ratio is None else f"{100 * ratio:.1f}%"
