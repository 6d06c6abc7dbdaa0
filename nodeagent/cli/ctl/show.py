"""nodeagentctl show JOB (scontrol show job): a pool job's spec, times, nodes per generation,
exit code, restarts by cause, and where its time went (model/goodput.py: the effective training
time ratio and the wall time cut into productive training, checkpoint stalls, re-training,
re-forms and waiting). `--json` documents carry `"version": 1`."""

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
from nodeagent.coord.keys import JobKeys
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.store import JobStore
from nodeagent.errors import NotFoundError
from nodeagent.job.history import generations, restarts_by_cause
from nodeagent.model import goodput
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
        return _outside_the_pool(target, job_id, snap.now_ms, as_json)
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
        generations=_generations(events),
        detail=record.detail if record else None,
        spec_error=spec if isinstance(spec, str) else None,
    )
    pending = goodput.pending_spans(_events(store), job_id)  # requeued, evicted: queued again
    account = goodput.account(events, snap.now_ms, status.submitted_ms, pending)
    doc["goodput"] = account.to_data() if account is not None else None
    if as_json:
        print(json.dumps(doc, indent=2))
    else:
        _print_show(doc)
    return 0


def _outside_the_pool(target: Target, job_id: str, now_ms: int, as_json: bool) -> int:
    """A job no pool knows (a node config's `job:` section without a pool, `nodeagent
    launch`): its record, generations and goodput.

    Raises:
        NotFoundError: no such job either."""
    jobs = JobStore(target.client, JobKeys(target.prefix, job_id))
    record = jobs.snapshot().record
    if record is None:
        raise NotFoundError(
            f"no job {job_id!r} in pool {target.pool_store.keys.pool} nor outside it "
            "(see nodeagentctl jobs)"
        )
    events = _events(jobs)
    account = goodput.account(events, now_ms)
    doc: dict[str, Any] = {
        "version": VERSION,
        "job": job_id,
        "pool": None,
        "state": record.state.value,
        "reason": record.reason,
        "restarts": record.restart_count,
        "restarts_by_cause": restarts_by_cause(events),
        "generations": _generations(events),
        "goodput": account.to_data() if account is not None else None,
        "detail": record.detail,
    }
    if as_json:
        print(json.dumps(doc, indent=2))
    else:
        _print_show(doc)
    return 0


def _generations(events: list[Event]) -> list[dict[str, Any]]:
    return [
        {
            "generation": g.number,
            "started": rfc3339(g.started_ms),
            "reason": g.reason,
            "nodes": list(g.members),
            "more_nodes": g.more,
        }
        for g in generations(events)
    ]


def _limit(spec: JobSpec | None) -> str | None:
    return format_duration(spec.time_limit) if spec and spec.time_limit is not None else None


def _events(stream: JobStore | PoolStore) -> list[Event]:
    """A job's (or the pool's) events, the newest EVENTS_READ; what does not decode is left out."""
    return eventlog.decoded(stream, EVENTS_READ)


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
    if doc.get("goodput"):
        print_goodput(doc["goodput"])
    if doc["generations"]:
        print(f"{'GENERATION':>10}  {'STARTED':<25} {'REASON':<14} NODES")
    for g in doc["generations"]:
        more = f" and {g['more_nodes']} more" if g["more_nodes"] else ""
        print(
            f"{g['generation']:>10}  {g['started']:<25} {g['reason'] or '-':<14} "
            f"{', '.join(g['nodes'])}{more}"
        )


LABELS = {
    "productive": "productive",
    "queued": "queued (pending, held)",
    "checkpoint_stalls": "checkpoint stalls",
    "retrained": "re-training lost steps",
    "slow_ranks": "slow ranks",
    "first_start": "first start",
    "detection": "detection",
    "reforming": "re-forming",
    "startup_restore": "start-up and restore",
    "waiting": "waiting for nodes",
    "ending": "ending",
}


def print_goodput(data: dict[str, Any]) -> None:
    """Where the time went: the ETTR, each part of the wall time, each re-form."""
    wall, ettr = data["wall_s"], data["ettr"]
    ratio = f"{100 * ettr:.1f} %" if ettr is not None else "-"
    print(f"{'goodput:':<19} ETTR {ratio} of {format_duration(wall)}", end="")
    print(f", {data['steps_lost']} steps lost" if data["steps_lost"] else "")
    for key, label in LABELS.items():
        seconds = data["parts"].get(key, 0.0)
        if seconds > 0:
            share = 100 * seconds / wall if wall > 0 else 0.0
            print(f"  {label + ':':<24} {seconds:>9.1f} s {share:5.1f} %")
    for r in data["reforms"]:
        lost = r["steps_lost"] if r["steps_lost"] is not None else "?"
        print(
            f"  generation {r['generation']} ({r['reason'] or '-'}): detection "
            f"{r['detection_s']:.1f} s, re-forming {r['reforming_s']:.1f} s, start-up and "
            f"restore {r['startup_restore_s']:.1f} s, {lost} steps lost "
            f"({r['retrained_s']:.1f} s)"
        )
    print(f"  {'rank-hours trained:':<24} {data['rank_hours']:>9.3f}", end="")
    short = data.get("short_rank_hours", 0.0)
    print(f"  (short of the target world: {short:.3f})" if short else "")
    if data["unaccounted"]:
        gens = ", ".join(str(g) for g in data["unaccounted"])
        print(f"  (rank 0 said nothing of its training in generation {gens}: counted productive)")
