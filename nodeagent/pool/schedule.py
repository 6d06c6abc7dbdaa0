"""The pool's decision: which node serves which job. Pure: `schedule(view, policy)`.

Rules (docs/design.md, "The pool"):
- a node serves one job at a time; a node pinned by its `job:` section serves only that job;
- gang admission: a pending job is admitted only when at least `min_nodes` healthy,
  uncordoned, free nodes that do not refuse it (and carry the labels its `selector` names) can
  be given to it at once; it gets up to its target; never a partial start below `min_nodes`;
- order: priority (higher first), then first come, first served;
- backfill with a reservation: a job that does not fit does not block smaller jobs behind it,
  until the first job in order that could fit the pool has waited `reserve_after`; from then on
  free nodes are held for it (nothing behind it is admitted, no running job grows) until it fits.
  Pure FIFO would idle the pool behind one large job; pure backfill could starve it for ever;
- a running job below its target grows into free nodes; above its target (after a scale down)
  it gives back the nodes its record does not name as members;
- a cordoned node keeps the job it serves but gets no new one; a drained node leaves its job
  now (its workers get the stop grace; the job re-forms without it);
- a job ends when its own record does (succeeded, failed, stopped = cancelled); its nodes go
  back to the pool at once. A node whose lease lapsed loses its placement (the job re-forms
  through its own protocol, and grows back into a free node).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from nodeagent.model import Event
from nodeagent.pool.model import PoolJob, PoolJobState
from nodeagent.state import JobState

_CANCELLED = PoolJobState.CANCELLED
_ENDED = {
    JobState.SUCCEEDED: PoolJobState.SUCCEEDED,
    JobState.FAILED: PoolJobState.FAILED,
    JobState.STOPPED: PoolJobState.CANCELLED,
}


@dataclass(frozen=True)
class NodeView:
    """A node that holds a live pool lease."""

    name: str
    pinned: str | None = None
    unfit: str | None = None  # its GPUs cannot take a job
    cordoned: str | None = None  # an operator's pool cordon
    drained: bool = False  # ... that also takes it off its job now
    refused: frozenset[str] = frozenset()  # jobs it cannot run
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def eligible(self) -> bool:
        return self.unfit is None and self.cordoned is None and self.pinned is None


@dataclass(frozen=True)
class JobView:
    """A job as the pool leader sees it: its pool status, its spec's bounds, its own record."""

    id: str
    status: PoolJob
    min_nodes: int
    max_nodes: int
    target_nodes: int  # the record's when it has one (scale), else the spec's
    priority: int = 0
    queue: str = "default"
    record_state: JobState | None = None  # None: no record (yet), or unreadable
    members: tuple[str, ...] = ()
    cancel: str | None = None  # who asked to cancel it
    invalid: str | None = None  # its spec cannot be read: it fails
    selector: Mapping[str, str] = field(default_factory=dict)  # labels a node must have

    @property
    def order(self) -> tuple[int, int]:
        return (-self.priority, self.status.seq)


@dataclass(frozen=True)
class PoolView:
    now_ms: int
    nodes: Mapping[str, NodeView]
    jobs: Mapping[str, JobView]
    placements: Mapping[str, str]  # node -> job, as committed


@dataclass(frozen=True)
class SchedulePolicy:
    reserve_after_ms: int = 300_000


@dataclass(frozen=True)
class Schedule:
    placements: dict[str, str]  # node -> job, all of them
    jobs: dict[str, PoolJob] = field(default_factory=dict)  # statuses that changed
    events: tuple[Event, ...] = ()

    def changed(self, before: Mapping[str, str]) -> bool:
        return bool(self.jobs) or self.placements != dict(before)


class _Run:
    """The working state of one schedule() call, indexed so that a decision costs about
    nodes + jobs, not nodes x jobs (bench/schedule.py)."""

    def __init__(self, view: PoolView) -> None:
        self.view = view
        self.placements: dict[str, str] = {}
        self.by_job: dict[str, set[str]] = {}
        self.jobs: dict[str, PoolJob] = {}
        self.events: list[Event] = []
        nodes = view.nodes.values()
        self.eligible = sorted(n.name for n in nodes if n.eligible)  # handed out in this order
        self._eligible = set(self.eligible)
        self._head = 0  # every node of eligible[:_head] is placed
        self._free = len(self.eligible)  # eligible nodes not placed
        self.refusers: dict[str, set[str]] = {}  # nodes that refuse a job, or lack its labels
        self.unmatched: dict[str, int] = {}  # of those, how many lack its labels
        for node in nodes:
            for job_id in node.refused:
                self.refusers.setdefault(job_id, set()).add(node.name)
        for job in view.jobs.values():
            if job.selector:
                lacking = {n.name for n in nodes if not _matches(n.labels, job.selector)}
                self.refusers.setdefault(job.id, set()).update(lacking)
                self.unmatched[job.id] = len(lacking)
        self.healthy = {
            n.name for n in nodes if n.pinned is None and n.unfit is None and n.cordoned is None
        }

    def status(self, job: JobView) -> PoolJob:
        return self.jobs.get(job.id, job.status)

    def move(self, job: JobView, state: PoolJobState, reason: str, event: str) -> None:
        self.jobs[job.id] = self.status(job).moved(state, self.view.now_ms, reason)
        self.events.append(Event(event, message=f"job {job.id}: {reason}", data={"job": job.id}))

    def note(self, job: JobView, reason: str) -> None:
        """Say why a job waits (written only when the reason changes)."""
        if self.status(job).reason != reason:
            self.jobs[job.id] = replace(self.status(job), reason=reason)

    def place(self, node: str, job: str) -> None:
        self.unplace(node)
        self.placements[node] = job
        if node in self._eligible:
            self._free -= 1
        self.by_job.setdefault(job, set()).add(node)

    def unplace(self, node: str) -> None:
        job = self.placements.pop(node, None)
        if job is not None:
            self.by_job[job].discard(node)
            if node in self._eligible:
                self._free += 1
                self._head = 0  # freed: the cursor must see it again

    def placed(self, job: str) -> list[str]:
        return sorted(self.by_job.get(job, ()))

    def free_count(self, job: JobView) -> int:
        """Free eligible nodes that do not refuse `job`."""
        refusing = self.refusers.get(job.id, set())
        return self._free - sum(1 for n in refusing & self._eligible if n not in self.placements)

    def take(self, job: JobView, limit: int) -> list[str]:
        """Place up to `limit` free nodes (in name order) that do not refuse `job` on it."""
        self._advance()
        refusing = self.refusers.get(job.id, set())
        taken: list[str] = []
        for name in self.eligible[self._head :]:
            if len(taken) >= limit:
                break
            if name not in self.placements and name not in refusing:
                taken.append(name)
        for name in taken:
            self.place(name, job.id)
        return taken

    def _advance(self) -> None:
        eligible = self.eligible
        while self._head < len(eligible) and eligible[self._head] in self.placements:
            self._head += 1


def schedule(view: PoolView, policy: SchedulePolicy) -> Schedule:
    """The placements and job statuses that follow from `view`."""
    run = _Run(view)
    for job in sorted(view.jobs.values(), key=lambda j: j.order):
        _settle(run, job)
    _keep(run)
    _pin(run)
    for job in view.jobs.values():
        if run.status(job).state is PoolJobState.RUNNING:
            _shrink(run, job)
    reserved = _admit(run, policy)
    if not reserved:
        _grow(run)
    return Schedule(run.placements, run.jobs, tuple(run.events))


def _settle(run: _Run, job: JobView) -> None:
    """End jobs whose record ended (a pinned one follows its record both ways); cancel pending
    jobs asked to; a running job asked to cancel ends once stopped (or if it never formed)."""
    state, record = job.status.state, job.record_state
    if job.invalid is not None and not state.ended:
        run.move(job, PoolJobState.FAILED, job.invalid, "job_ended")
        return
    ended = _ENDED.get(record) if record is not None else None
    if job.status.pinned:
        if ended is not None and record is not None and state is not ended:
            run.move(job, ended, f"its record is {record.value}", "job_ended")
        elif ended is None and state is not PoolJobState.RUNNING:
            run.move(job, PoolJobState.RUNNING, "pinned by its nodes", "job_running")
        return
    if state is PoolJobState.PENDING and job.cancel is not None:
        run.move(
            job, PoolJobState.CANCELLED, f"cancelled by {job.cancel} while pending", "job_ended"
        )
    elif state is PoolJobState.RUNNING and job.cancel is not None and ended in (None, _CANCELLED):
        if record is None or ended is not None:  # stopped, or never formed
            run.move(job, PoolJobState.CANCELLED, f"cancelled by {job.cancel}", "job_ended")
    elif state is PoolJobState.RUNNING and ended is not None and record is not None:
        run.move(job, ended, f"its record is {record.value}", "job_ended")


def _keep(run: _Run) -> None:
    """Keep the placements that still hold: a live node, on a running job it does not refuse."""
    view = run.view
    for node, job_id in view.placements.items():
        job = view.jobs.get(job_id)
        live = view.nodes.get(node)
        if (
            job is not None
            and live is not None
            and run.status(job).state is PoolJobState.RUNNING
            and job_id not in live.refused
            and not live.drained
            and (live.pinned is None or live.pinned == job_id)
        ):
            run.place(node, job_id)


def _pin(run: _Run) -> None:
    for node in run.view.nodes.values():
        job = run.view.jobs.get(node.pinned or "")
        if job is not None and run.status(job).state is PoolJobState.RUNNING:
            run.place(node.name, job.id)


def _shrink(run: _Run, job: JobView) -> None:
    """Above target (after a scale down): give back placed nodes that are not members."""
    extra = len(run.by_job.get(job.id, ())) - job.target_nodes
    if extra <= 0:
        return
    placed = run.placed(job.id)
    spare = [
        n for n in reversed(placed) if n not in job.members and run.view.nodes[n].pinned is None
    ]
    for node in spare[:extra]:
        run.unplace(node)


def _admit(run: _Run, policy: SchedulePolicy) -> bool:
    """Admit pending jobs in order; True when free nodes are now reserved for the head."""
    view = run.view
    pending = sorted(
        (j for j in view.jobs.values() if run.status(j).state is PoolJobState.PENDING),
        key=lambda j: j.order,
    )
    reserving: JobView | None = None
    for job in pending:
        if reserving is not None:
            run.note(job, f"waiting: nodes are held for {reserving.id}, pending longer")
            continue
        free = run.free_count(job)
        if free >= job.min_nodes:
            take = run.take(job, job.target_nodes)
            run.move(job, PoolJobState.RUNNING, f"admitted on {len(take)} nodes", "job_admitted")
            continue
        fits_pool = _could_fit(run, job)
        if fits_pool is not None:
            run.note(job, fits_pool)
            continue
        waited = view.now_ms - job.status.submitted_ms
        run.note(job, f"needs {job.min_nodes} nodes, {free} free")
        if waited >= policy.reserve_after_ms:
            reserving = job
    return reserving is not None


def _could_fit(run: _Run, job: JobView) -> str | None:
    """Why `job` can never fit this pool as it is, or None."""
    excluded = run.refusers.get(job.id, set())
    healthy = len(run.healthy) - len(excluded & run.healthy)
    if healthy >= job.min_nodes:
        return None
    unmatched = run.unmatched.get(job.id, 0)
    why = f"; {len(excluded) - unmatched} refuse it" if len(excluded) > unmatched else ""
    if unmatched:
        labels = ",".join(f"{k}={v}" for k, v in sorted(job.selector.items()))
        why += f"; {unmatched} lack {labels}"
    return f"needs {job.min_nodes} nodes, the pool has {healthy} healthy nodes that can run it{why}"


def _matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def _grow(run: _Run) -> None:
    """Running jobs below their target take free nodes, in order."""
    running = sorted(
        (j for j in run.view.jobs.values() if run.status(j).state is PoolJobState.RUNNING),
        key=lambda j: j.order,
    )
    for job in running:
        if run.status(job).pinned:
            continue
        want = job.target_nodes - len(run.by_job.get(job.id, ()))
        if want > 0:
            run.take(job, want)
