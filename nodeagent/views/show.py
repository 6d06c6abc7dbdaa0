"""A pool job in full (`nodeagentctl show`, GET /v1/jobs/{job}): its spec, times, nodes per
generation, exit code, restarts by cause, and where its time went (model/goodput.py: the
effective training time ratio and the wall time cut into productive training, checkpoint
stalls, re-training, re-forms and waiting). Documents carry `"version": 1`."""

from __future__ import annotations

from typing import Any

from nodeagent.config.values import format_duration
from nodeagent.coord import eventlog, holds
from nodeagent.coord.eventlog import DecodedTail
from nodeagent.coord.keys import JobKeys
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.store import JobStore
from nodeagent.errors import NotFoundError
from nodeagent.model import depend, goodput
from nodeagent.model.history import generations, restarts_by_cause
from nodeagent.model.job import Event
from nodeagent.model.spec import JobSpec
from nodeagent.views.documents import JSON_VERSION as VERSION
from nodeagent.views.documents import rfc3339
from nodeagent.views.runs import Run

EVENTS_READ = 10_000  # a job's whole event stream (it is capped at that)


def show(
    store: PoolStore, prefix: str, job_id: str, pool_events: DecodedTail | None = None
) -> dict[str, Any]:
    """The job's document. `pool_events`: the pool's events as a long-lived reader keeps them
    (None: read now).

    Raises:
        NotFoundError: no such job in the pool nor outside it.
    """
    status = store.status(job_id)
    now_ms, placed = store.placed(job_id)
    if status is None:
        return _outside_the_pool(store, prefix, job_id, now_ms)
    spec = store.spec(job_id)
    entry = Run(job_id, spec if isinstance(spec, JobSpec) else None, status)
    doc = entry.row(now_ms, len(placed))
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
        dependency=depend.text(entry.spec.dependency) or None if entry.spec else None,
        held_by=holds.held_by(store, job_id),
        placed=placed,
        restarts=record.restart_count if record else None,
        restarts_by_cause=restarts_by_cause(events),
        generations=_generations(events),
        detail=record.detail if record else None,
        spec_error=spec if isinstance(spec, str) else None,
    )
    told = pool_events.read(store) if pool_events is not None else _events(store)
    pending = goodput.pending_spans(told, job_id)  # requeued, evicted: queued again
    account = goodput.account(events, now_ms, status.submitted_ms, pending)
    doc["goodput"] = account.to_data() if account is not None else None
    return doc


def _outside_the_pool(store: PoolStore, prefix: str, job_id: str, now_ms: int) -> dict[str, Any]:
    """A job no pool knows (a node config's `job:` section without a pool, `nodeagent
    launch`): its record, generations and goodput.

    Raises:
        NotFoundError: no such job either."""
    jobs = JobStore(store.client, JobKeys(prefix, job_id))
    record = jobs.snapshot().record
    if record is None:
        raise NotFoundError(
            f"no job {job_id!r} in pool {store.keys.pool} nor outside it (see nodeagentctl jobs)"
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
    return doc


def _generations(events: list[Event]) -> list[dict[str, Any]]:
    return [
        {
            "generation": g.number,
            "started": rfc3339(g.started_ms),
            "started_ms": g.started_ms,
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
