"""nodeagentctl show JOB (scontrol show job): a pool job's spec, times, nodes per generation,
exit code and restarts by cause. `--json` documents carry `"version": 1`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from nodeagent.cli.ctl import argtypes
from nodeagent.cli.ctl.output import JSON_VERSION as VERSION
from nodeagent.cli.ctl.output import rfc3339
from nodeagent.cli.ctl.runs import Run
from nodeagent.cli.ctl.targets import Target
from nodeagent.config.values import format_duration
from nodeagent.coord import eventlog, holds
from nodeagent.coord.store import JobStore
from nodeagent.errors import CorruptStateError, NotFoundError
from nodeagent.job.history import generations, restarts_by_cause
from nodeagent.model.job import Event
from nodeagent.model.spec import JobSpec

HELP = "a pool job in full: command, user, times, nodes per generation, exit code"
EVENTS_READ = 10_000  # a job's whole event stream (it is capped at that)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", metavar="JOB", type=argtypes.name)
    parser.add_argument("--json", action="store_true")


def run(target: Target, args: argparse.Namespace) -> int:
    store, job_id, as_json = target.pool_store, args.job_id, args.json
    snap = store.read()
    status = snap.jobs.get(job_id)
    if status is None:
        raise NotFoundError(f"no job {job_id!r} in pool {store.keys.pool} (see nodeagentctl jobs)")
    spec = store.spec(job_id)
    entry = Run(job_id, spec if isinstance(spec, JobSpec) else None, status)
    doc = entry.row(snap.now_ms, len(snap.placements_of(job_id)))
    jobs = JobStore(store.client, store.keys.job(job_id))
    events = _events(jobs)
    record = jobs.snapshot().record
    doc.update(
        version=VERSION,
        pool=store.keys.pool,
        submitted_by=entry.spec.submitted_by if entry.spec else None,
        command=list(entry.spec.job.entrypoint) if entry.spec else None,
        working_dir=entry.spec.job.working_dir if entry.spec else None,
        min_nodes=entry.spec.job.min_nodes if entry.spec else None,
        max_nodes=entry.spec.job.max_nodes if entry.spec else None,
        time_limit=_limit(entry.spec),
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
