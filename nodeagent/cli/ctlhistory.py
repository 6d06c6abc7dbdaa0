"""nodeagentctl show JOB (scontrol show job) and nodeagentctl history (sacct): a pool job's
spec, times, nodes per generation, exit code and restarts by cause; the ended jobs the pool
keeps (pool.keep_ended) with their user, elapsed time, nodes, node-hours and exit code.

Times are RFC 3339 (UTC); `--json` documents carry `"version": 1`.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from nodeagent.cli import ctlargs
from nodeagent.cli.ctlshow import JSON_VERSION as VERSION
from nodeagent.cli.ctlshow import listing, rfc3339
from nodeagent.config.values import format_duration, parse_duration
from nodeagent.coord import eventlog, holds
from nodeagent.coord.ended import archived
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.store import JobStore
from nodeagent.errors import ConfigError, CorruptStateError, NotFoundError, UsageError
from nodeagent.job.history import generations, restarts_by_cause
from nodeagent.model.job import Event
from nodeagent.model.pool import PoolJob, PoolJobState
from nodeagent.model.spec import JobSpec

COMMANDS = frozenset({"show", "history"})
EVENTS_READ = 10_000  # a job's whole event stream (it is capped at that)


def add_parsers(commands: Any) -> None:
    show = commands.add_parser(
        "show", help="a pool job in full: command, user, times, nodes per generation, exit code"
    )
    show.add_argument("job_id", metavar="JOB", type=ctlargs.name)
    show.add_argument("--json", action="store_true")
    history = commands.add_parser(
        "history", help="the ended jobs the pool keeps: user, elapsed, nodes, node-hours, exit"
    )
    history.add_argument(
        "--since",
        metavar="WHEN",
        help="only jobs that ended since WHEN: a duration ago (2h, 7d) or an RFC 3339 time",
    )
    history.add_argument("--user", help="only the jobs that ran as this user")
    ended = [s.value for s in PoolJobState if s.ended]
    history.add_argument("--state", choices=ended, help="only the jobs that ended so")
    history.add_argument("--json", action="store_true")


def run(store: PoolStore, args: argparse.Namespace) -> int:
    if args.command == "show":
        return _show(store, args.job_id, args.json)
    return _history(store, args)


@dataclass(frozen=True)
class _Run:
    """One run of a job as the pool keeps it: its id, spec and status."""

    job: str
    spec: JobSpec | None
    status: PoolJob

    def node_hours(self, now_ms: int, placed: int) -> float:
        """Node-hours held so far (the nodes placed now counted up to `now_ms`)."""
        since = self.status.accounted_ms
        held = self.status.node_ms + (placed * max(0, now_ms - since) if since else 0)
        return held / 3_600_000

    def row(self, now_ms: int, placed: int = 0) -> dict[str, Any]:
        status, spec = self.status, self.spec
        start, end = status.admitted_ms, status.ended_ms
        elapsed = None if start is None else ((end or now_ms) - start) / 1000
        return {
            "job": self.job,
            "seq": status.seq,
            "user": spec.user if spec else None,
            "state": status.state.value,
            "queue": spec.queue if spec else None,
            "priority": spec.priority if spec else None,
            "submitted": rfc3339(status.submitted_ms),
            "started": rfc3339(start),
            "ended": rfc3339(end),
            "elapsed_s": elapsed,
            "nodes": status.peak_nodes,
            "node_hours": round(self.node_hours(now_ms, placed), 4),
            "exit_code": _exit_code(status),
            "reason": status.reason,
        }


def _exit_code(status: PoolJob) -> int | None:
    if not status.state.ended:
        return None
    if status.state is PoolJobState.SUCCEEDED:
        return 0
    return status.exit_code or 1


def _show(store: PoolStore, job_id: str, as_json: bool) -> int:
    snap = store.read()
    status = snap.jobs.get(job_id)
    if status is None:
        raise NotFoundError(f"no job {job_id!r} in pool {store.keys.pool} (see nodeagentctl jobs)")
    spec = store.spec(job_id)
    run = _Run(job_id, spec if isinstance(spec, JobSpec) else None, status)
    doc = run.row(snap.now_ms, len(snap.placements_of(job_id)))
    jobs = JobStore(store.client, store.keys.job(job_id))
    events = _events(jobs)
    record = jobs.snapshot().record
    doc.update(
        version=VERSION,
        pool=store.keys.pool,
        submitted_by=run.spec.submitted_by if run.spec else None,
        command=list(run.spec.job.entrypoint) if run.spec else None,
        working_dir=run.spec.job.working_dir if run.spec else None,
        min_nodes=run.spec.job.min_nodes if run.spec else None,
        max_nodes=run.spec.job.max_nodes if run.spec else None,
        time_limit=_limit(run.spec),
        held_by=holds.held_by(store, job_id),
        placed=snap.placements_of(job_id),
        restarts=record.restart_count if record else None,
        restarts_by_cause=restarts_by_cause(events),
        generations=[
            {
                "generation": g.number,
                "started": rfc3339(g.started_ms),
                "reason": g.reason,
                "nodes": list(g.members),
                "more_nodes": g.more,
            }
            for g in generations(events)
        ],
        detail=record.detail if record else None,
        spec_error=spec if isinstance(spec, str) else None,
    )
    if as_json:
        print(json.dumps(doc, indent=2))
    else:
        _print_show(doc)
    return 0


def _limit(spec: JobSpec | None) -> str | None:
    return format_duration(spec.time_limit) if spec and spec.time_limit is not None else None


def _events(jobs: JobStore) -> list[Event]:
    found = []
    for entry_id, fields in eventlog.tail(jobs, EVENTS_READ):
        try:
            found.append(Event.from_stream(entry_id, fields.get("event", "")))
        except CorruptStateError:
            continue
    return found


SHOWN = (
    ("job", "job"),
    ("state", "state"),
    ("reason", "reason"),
    ("user", "user"),
    ("submitted_by", "submitted by"),
    ("queue", "queue"),
    ("priority", "priority"),
    ("command", "command"),
    ("working_dir", "working dir"),
    ("time_limit", "time limit"),
    ("held_by", "held by"),
    ("submitted", "submitted"),
    ("started", "started"),
    ("ended", "ended"),
    ("elapsed_s", "elapsed"),
    ("placed", "nodes now"),
    ("nodes", "nodes (most)"),
    ("node_hours", "node-hours"),
    ("exit_code", "exit code"),
    ("restarts", "restarts"),
    ("restarts_by_cause", "restarts by cause"),
    ("detail", "detail"),
)


def _print_show(doc: dict[str, Any]) -> None:
    for key, label in SHOWN:
        value = doc.get(key)
        if value in (None, "", {}, []):
            continue
        if key == "elapsed_s":
            value = format_duration(value)
        elif key == "command":
            value = " ".join(value)
        elif key == "placed":
            value = ", ".join(value)
        elif key == "restarts_by_cause":
            value = ", ".join(f"{cause} {n}" for cause, n in sorted(value.items()))
        print(f"{label + ':':<19} {value}")
    if doc["generations"]:
        print(f"{'GENERATION':>10}  {'STARTED':<25} {'REASON':<14} NODES")
    for g in doc["generations"]:
        more = f" and {g['more_nodes']} more" if g["more_nodes"] else ""
        print(
            f"{g['generation']:>10}  {g['started']:<25} {g['reason'] or '-':<14} "
            f"{', '.join(g['nodes'])}{more}"
        )


def _history(store: PoolStore, args: argparse.Namespace) -> int:
    snap = store.read()
    since = _since(args.since, snap.now_ms) if args.since else None
    ended = [j for j, s in snap.jobs.items() if s.state.ended and not s.pinned]
    specs = store.specs(ended)
    runs = [_Run(j, s if isinstance(s, JobSpec) else None, snap.jobs[j]) for j, s in specs.items()]
    runs += [_Run(j, spec, status) for j, spec, status in archived(store.client, store.keys)]
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
        f"{'NODE-H':>8} {'EXIT':>4}"
    )
    for r in rows:
        elapsed = format_duration(r["elapsed_s"]) if r["elapsed_s"] is not None else "-"
        print(
            f"{r['job']:<24} {r['user'] or '-':<12} {r['state']:<10} {r['ended'] or '-':<25} "
            f"{elapsed:>9} {r['nodes']:>5} {r['node_hours']:>8.2f} {r['exit_code']!s:>4}"
        )
    return 0


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
