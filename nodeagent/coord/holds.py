"""hold, release, requeue of a pool job: the requests the pool leader's round acts on.

Only the pool leader writes a job's status, so these write beside it: `holds` (a pending job
that is not admitted while held) and `requeues` (a running job to put back in the queue, for the
run admitted at a given time: once it is admitted again the request is stale and ignored). Each
write goes with the event that tells of it, in one transaction.
"""

from __future__ import annotations

from typing import Any

from nodeagent.coord import streams
from nodeagent.coord.errors import redis_errors
from nodeagent.coord.pool import PoolStore
from nodeagent.model.job import Event
from nodeagent.model.pool import Requeue


def held_by(store: PoolStore, job_id: str) -> str | None:
    """Who holds `job_id` (None: nobody)."""
    with redis_errors("read a hold"):
        found: Any = store.client.hget(store.keys.holds, job_id)
    return str(found) if found is not None else None


def hold(store: PoolStore, job_id: str, by: str) -> None:
    """Keep pending job `job_id` from being admitted until `release`."""
    event = Event("job_held", message=f"job {job_id}: held by {by}", data={"job": job_id})
    keys = store.keys
    streams.write_with_event(
        store.client, "hold", lambda pipe: pipe.hset(keys.holds, job_id, by), keys.events, event
    )


def release(store: PoolStore, job_id: str, by: str) -> bool:
    """Let held job `job_id` be admitted again; False if it was not held."""
    event = Event("job_released", message=f"job {job_id}: released by {by}", data={"job": job_id})
    keys = store.keys
    removed = streams.write_with_event(
        store.client, "release", lambda pipe: pipe.hdel(keys.holds, job_id), keys.events, event
    )
    return bool(removed)


def requeue(store: PoolStore, job_id: str, by: str, admitted_ms: int) -> None:
    """Ask the pool leader to put running job `job_id` (its run admitted at `admitted_ms`) back
    in the queue: its nodes leave it (its workers get the stop grace to checkpoint) and it
    waits, pending, in its place."""
    event = Event("job_requeue", message=f"job {job_id}: requeue by {by}", data={"job": job_id})
    keys, ask = store.keys, Requeue(by, admitted_ms).to_json()
    streams.write_with_event(
        store.client,
        "requeue",
        lambda pipe: pipe.hset(keys.requeues, job_id, ask),
        keys.events,
        event,
    )
