"""A submission, whoever stores it (the pool leader for a signed request, nodeagentctl under
pool.auth: none): what it is checked against before anything is written, and how an array is
stored, one job per task, in one round trip."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from nodeagent.config.container import pool_refusal
from nodeagent.coord.pool import PoolStore
from nodeagent.model import depend
from nodeagent.model.job import Event
from nodeagent.model.pool import PoolJob, PoolNode
from nodeagent.model.queues import DEFAULT
from nodeagent.model.spec import JobSpec, array_tasks
from nodeagent.pool.schedule import matches


class Refused(Exception):
    """A request the caller may not make, or one that cannot be done: the reply says why."""


def store_array(
    store: PoolStore, spec: JobSpec, held_by: str, sign: Callable[[JobSpec], JobSpec]
) -> str:
    """Store an array submission as one job per task (model/array.py), in one round trip.

    Raises:
        Refused: a job of the array's id, or of one of its tasks' ids, has not ended.
    """
    pool = store.keys.pool
    tasks = array_tasks(spec)
    own = store.status(spec.id)
    if own is not None and not own.state.ended:
        raise Refused(in_use(spec.id, pool, own))
    for task in tasks:
        status = store.status(task.id)
        if status is not None and not status.state.ended:
            raise Refused(in_use(task.id, pool, status))
    array = spec.array
    limit = f", at most {array.limit} at once" if array is not None and array.limit else ""
    said = f"array {spec.id}: {len(tasks)} tasks submitted by {spec.submitted_by}{limit}"
    event = Event("array_submitted", message=said, data={"job": spec.id, "tasks": len(tasks)})
    stored = store.submit_many([sign(t) for t in tasks], held_by, event)
    lost = [t.id for t, (created, _) in zip(tasks, stored, strict=True) if not created]
    if lost:
        raise Refused(
            f"array {spec.id}: {len(lost)} task ids were taken meanwhile ({lost[0]}, ...)"
        )
    return f"{said}: {tasks[0].id} to {tasks[-1].id}, runs as {spec.user}"


def submission_refusal(store: PoolStore, spec: JobSpec) -> str | None:
    """Why the pool refuses a valid spec, whoever stores it (the pool leader for a signed
    request, nodeagentctl under pool.auth: none): its queue does not exist, or caps its
    priority below it; a job it depends on is not in the pool; no node would run its
    container."""
    pool = store.keys.pool
    queue = store.queue(spec.queue)
    if queue is None and spec.queue != DEFAULT:
        return (
            f"queue {spec.queue} does not exist in pool {pool}: an operator makes it "
            f"(`nodeagentctl queue create {spec.queue}`), or submit to another"
        )
    ceiling = queue.max_priority if queue is not None else None
    if ceiling is not None and spec.priority > ceiling:
        return f"priority {spec.priority} is above queue {spec.queue}'s ceiling of {ceiling}"
    for parent in depend.named(spec.dependency):
        if store.status(parent) is None:
            return (
                f"dependency: no job {parent!r} in pool {pool} "
                "(a job depends only on jobs submitted before it)"
            )
    if spec.job.container is not None:  # every node's report read only where it matters
        return container_refusal(spec, store.nodes().values())
    return None


def container_refusal(spec: JobSpec, nodes: Iterable[PoolNode]) -> str | None:
    """Why `submit` refuses `spec`'s container: no live node its selector names would run it,
    by the rules the nodes offer in their reports (docs/pool.md, "Your own software"). None
    also when no node said (a pool of older agents, or none up yet): placement decides then."""
    container = spec.job.container
    if container is None:
        return None
    offers = [
        n.containers for n in nodes if n.containers is not None and matches(n.labels, spec.selector)
    ]
    return pool_refusal(container, offers)


def in_use(job_id: str, pool: str, status: PoolJob | None) -> str:
    """Why a submission under `job_id` is refused: a job of that id has not ended."""
    if status is not None and status.pinned:
        return f"job {job_id} exists in pool {pool}: its nodes' job: sections run it"
    state = status.state.value if status is not None else "its status unreadable"
    return (
        f"job {job_id} exists in pool {pool} and has not ended ({state}); choose another "
        "--name, or submit it again once it has ended"
    )
