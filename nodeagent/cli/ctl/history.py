"""nodeagentctl history (sacct): the ended jobs the pool keeps (pool.keep_ended) with their
user, elapsed time, nodes, node-hours, exit code and effective training time ratio (ETTR: the
pool leader accounts it from the job's events as it ends, model/goodput.py). `--json` documents
carry `"version": 1`."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime

from nodeagent.cli.ctl.output import listing
from nodeagent.cli.ctl.runs import Run
from nodeagent.cli.ctl.targets import Target
from nodeagent.config.values import format_duration, parse_duration
from nodeagent.coord.ended import archived
from nodeagent.errors import ConfigError, UsageError
from nodeagent.model.pool import PoolJobState
from nodeagent.model.spec import JobSpec

HELP = "the ended jobs the pool keeps: user, elapsed, nodes, node-hours, exit, ETTR"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--since",
        metavar="WHEN",
        help="only jobs that ended since WHEN: a duration ago (2h, 7d) or an RFC 3339 time",
    )
    parser.add_argument("--user", help="only the jobs that ran as this user")
    ended = [s.value for s in PoolJobState if s.ended]
    parser.add_argument("--state", choices=ended, help="only the jobs that ended so")
    parser.add_argument("--json", action="store_true")


def run(target: Target, args: argparse.Namespace) -> int:
    store = target.pool_store
    snap = store.read()
    since = _since(args.since, snap.now_ms) if args.since else None
    ended = [j for j, s in snap.jobs.items() if s.state.ended and not s.pinned]
    specs = store.specs(ended)
    runs = [Run(j, s if isinstance(s, JobSpec) else None, snap.jobs[j]) for j, s in specs.items()]
    runs += [Run(j, spec, status) for j, spec, status in archived(store.client, store.keys)]
    rows = [
        run.row(snap.now_ms)
        for run in sorted(runs, key=lambda r: r.status.ended_ms or 0)
        if (since is None or (run.status.ended_ms or 0) >= since)
        and (args.user is None or (run.spec is not None and run.spec.user == args.user))
        and (args.state is None or run.status.state.value == args.state)
    ]
    if args.json:
        print(json.dumps(listing("jobs", store.keys.pool, rows), indent=2))
        return 0
    print(
        f"{'JOB':<24} {'USER':<12} {'STATE':<10} {'ENDED':<25} {'ELAPSED':>9} {'NODES':>5} "
        f"{'NODE-H':>8} {'EXIT':>4} {'ETTR':>6}"
    )
    for r in rows:
        elapsed = format_duration(r["elapsed_s"]) if r["elapsed_s"] is not None else "-"
        print(
            f"{r['job']:<24} {r['user'] or '-':<12} {r['state']:<10} {r['ended'] or '-':<25} "
            f"{elapsed:>9} {r['nodes']:>5} {r['node_hours']:>8.2f} {r['exit_code']!s:>4} "
            f"{_percent(r['ettr']):>6}"
        )
    return 0


def _percent(ratio: float | None) -> str:
    return "-" if ratio is None else f"{100 * ratio:.1f}%"


def _since(value: str, now_ms: int) -> int:
    """--since: a duration ago, or an RFC 3339 time (a date alone: its midnight, UTC).

    Raises:
        UsageError: neither.
    """
    try:
        return now_ms - round(parse_duration(value, "--since") * 1000)
    except ConfigError:
        pass
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"--since: expected a duration ago (2h, 7d) or an RFC 3339 time "
            f"(2026-11-23T08:00:00Z), got {value!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return round(when.timestamp() * 1000)
