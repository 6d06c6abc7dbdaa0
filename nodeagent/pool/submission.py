"""A submission, whoever stores it (the pool leader for a signed request, nodeagentctl under
pool.auth: none): what it is checked against before anything is written, and how an array is
stored, one job per task, in one round trip."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from nodeagent.config.container import pool_refusal
from nodeagent.coord import runs
from nodeagent.coord.errors import redis_errors
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.poolreplies import queue_of, status_of
from nodeagent.model import depend
from nodeagent.model.job import Event
from nodeagent.model.pool import PoolJob, PoolNode
from nodeagent.model.queues import DEFAULT
from nodeagent.model.spec import SPEC_MAX_BYTES, JobSpec, array_tasks
from nodeagent.pool.schedview import matches


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
    with redis_errors("read the tasks' ids"):
        raws: Any = store.client.hmget(store.keys.jobs, [t.id for t in tasks])
    for task, raw in zip(tasks, raws, strict=True):
        if raw is not None and not _ended(raw):
            raise Refused(in_use(task.id, pool, status_of(raw)))
    with redis_errors("register the array"):
        store.client.hset(store.keys.arrays, spec.id, spec.user)
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


@dataclass
class Known:
    """What `checked` reads of the pool, read for a batch of submissions in one round trip
    (`read`), not one each: whether each id names an array, and each queue's document. The
    pool leader reads it as it takes a batch and forgets what a request of the batch changes
    (a queue written, an array stored); what another writer changes meanwhile is seen as late
    as when each submission read it just before its own script."""

    arrays: dict[str, bool] = field(default_factory=dict)
    queues: dict[str, str | None] = field(default_factory=dict)

    def read(self, store: PoolStore, ids: list[str], queues: list[str]) -> None:
        """Forget what was read, then read these ids' and queues' (one round trip)."""
        self.forget()
        self._add(store, ids, queues)

    def forget(self) -> None:
        self.arrays, self.queues = {}, {}

    def of(self, store: PoolStore, spec: JobSpec) -> tuple[bool, str | None]:
        """Whether `spec`'s id names an array, and its queue's document: read now if not yet
        (and kept for the batch)."""
        if spec.id not in self.arrays or spec.queue not in self.queues:
            self._add(store, [spec.id], [spec.queue])
        return self.arrays[spec.id], self.queues[spec.queue]

    def _add(self, store: PoolStore, ids: list[str], queues: list[str]) -> None:
        if not ids:
            return
        queues = sorted(set(queues))
        with redis_errors("read the arrays and the queues"):
            pipe = store.client.pipeline(transaction=False)
            pipe.hmget(store.keys.arrays, ids)
            pipe.hmget(store.keys.queues, queues)
            arrays, raws = pipe.execute()
        self.arrays.update((i, raw is not None) for i, raw in zip(ids, arrays, strict=True))
        self.queues.update(zip(queues, raws, strict=True))


def checked(store: PoolStore, spec: JobSpec, known: Known | None = None) -> JobSpec:
    """`spec` as the pool stores it, whoever stores it (the pool leader for a signed request,
    nodeagentctl under pool.auth: none): each job it depends on bound to the run it names now
    (its seq: a job that takes over the id later is not that run). `known`: the arrays and
    queues read for a batch of submissions (what it lacks is read here).

    Raises:
        Refused: its queue does not exist, or caps its priority below it; a job it depends on
            is not in the pool; an array's id is a live array's; no node would run its
            container.
    """
    pool = store.keys.pool
    named, raw_queue = (known or Known()).of(store, spec)
    live = _live_array(store, spec.id) if named else 0
    if live:
        raise Refused(
            f"{spec.id} is an array of {live} tasks not ended in pool {pool}: choose another "
            "--name, or submit it once they have ended"
        )
    queue = queue_of(spec.queue, raw_queue)
    if queue is None and spec.queue != DEFAULT:
        raise Refused(
            f"queue {spec.queue} does not exist in pool {pool}: an operator makes it "
            f"(`nodeagentctl queue create {spec.queue}`), or submit to another"
        )
    ceiling = queue.max_priority if queue is not None else None
    if ceiling is not None and spec.priority > ceiling:
        raise Refused(
            f"priority {spec.priority} is above queue {spec.queue}'s ceiling of {ceiling}"
        )
    bound: dict[str, int] = {}
    for parent in depend.named(spec.dependency):
        bound.update(_bound(store, parent))
    if spec.job.container is not None:  # every node's report read only where it matters
        refused = container_refusal(spec, store.nodes().values())
        if refused is not None:
            raise Refused(refused)
    if not bound and not spec.dependency_runs:
        return spec
    found = replace(spec, dependency_runs=bound)
    if len(found.to_json()) > SPEC_MAX_BYTES:
        raise Refused(
            f"dependency: the runs it names make the spec larger than {SPEC_MAX_BYTES} bytes "
            "(an array's tasks are bound one by one): name fewer"
        )
    return found


def _bound(store: PoolStore, parent: str) -> dict[str, int]:
    """The run a dependency names: the job's, or each task's of the array of that id (the
    array's id then marked depend.ARRAY).

    Raises:
        Refused: neither is in the pool.
    """
    status = store.status(parent)
    if status is not None:
        return {parent: status.seq}
    tasks = runs.tasks_of(store, parent)
    if not tasks:
        raise Refused(
            f"dependency: no job or array {parent!r} in pool {store.keys.pool} "
            "(a job depends only on jobs submitted before it)"
        )
    unreadable = [task for task, status in tasks.items() if status is None]
    if unreadable:
        raise Refused(f"dependency: the status of task {unreadable[0]} cannot be read")
    return {parent: depend.ARRAY} | {t: s.seq for t, s in tasks.items() if s is not None}


def _live_array(store: PoolStore, job_id: str) -> int:
    """How many tasks not ended the array of this id has (0: none), for an id that named an
    array (the arrays hash has it)."""
    statuses = runs.tasks_of(store, job_id).values()  # one that does not decode: in use
    live = sum(1 for status in statuses if status is None or not status.state.ended)
    if not live:
        with redis_errors("forget an ended array"):
            store.client.hdel(store.keys.arrays, job_id)
    return live


def _ended(raw: str) -> bool:
    """A stored status says its job ended (one that does not decode: in use, as the pool's
    submit script takes it)."""
    status = status_of(raw)
    return status is not None and status.state.ended


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
