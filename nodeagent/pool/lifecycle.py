"""What the pool leader does about ended jobs. Pure.

- A job id may be submitted again once its job has ended: the new job is stored `stale_keys`
  (coord/poolscripts.POOL_SUBMIT) and the pool leader clears the ended job's own keys before
  admitting it (`unstale`: which jobs, and their statuses without the mark).
- Ended jobs are kept for `pool.keep_ended`, then pruned with their history (`prunable`); the
  history of reused ids is pruned by the same horizon, at most once per `PRUNE_EVERY_MS`.
- Accounting (`account`): a job's node-time, counted at every change of its node count.
- Time limits (`deadlines`): a running job is sent its signal `signal` before its time limit,
  counted from its admission, and stopped at the limit (its workers get the stop grace, as for
  a cancel); schedule() then ends it as TIMEOUT once its record has stopped.
- Cancels (`Stopping`): a running job asked to cancel is told to stop by the pool leader, once
  a term, and schedule() ends it as CANCELLED once its record has stopped. Not by whoever asked:
  a request written while the job looked pending could meet the round that admitted it, and
  the job would then run on, cancelled but never told.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace

from nodeagent.config.values import format_duration
from nodeagent.model.pool import PoolJob, PoolJobState
from nodeagent.pool.schedview import JobView, PoolView

PRUNE_EVERY_MS = 60_000


def unstale(view: PoolView) -> tuple[PoolView, dict[str, PoolJob]]:
    """The view with every pending `stale_keys` job as it will be once its keys are cleared,
    and those jobs' statuses (to write once their keys are cleared)."""
    fresh = {
        job_id: replace(job.status, stale_keys=False)
        for job_id, job in view.jobs.items()
        if job.status.stale_keys and job.status.state is PoolJobState.PENDING
    }
    if not fresh:
        return view, {}
    jobs = {j: replace(job, status=fresh[j]) if j in fresh else job for j, job in view.jobs.items()}
    return replace(view, jobs=jobs), fresh


def prunable(
    jobs: Mapping[str, PoolJob], placed: set[str], now_ms: int, keep_ended_ms: int
) -> tuple[str, ...]:
    """The submitted jobs that ended `keep_ended_ms` or more before `now_ms` and hold no node."""
    return tuple(
        sorted(
            job_id
            for job_id, status in jobs.items()
            if status.state.ended
            and not status.pinned
            and status.ended_ms is not None
            and now_ms - status.ended_ms >= keep_ended_ms
            and job_id not in placed
        )
    )


@dataclass
class Pruning:
    """When the pool leader last pruned (server ms): the history is looked at again after
    PRUNE_EVERY_MS, or `keep_ended` if shorter; jobs that are due are pruned at once."""

    last_ms: int | None = None

    def due(self, now_ms: int, keep_ended_ms: int, jobs: tuple[str, ...]) -> bool:
        every = min(PRUNE_EVERY_MS, keep_ended_ms)
        return bool(jobs) or self.last_ms is None or now_ms - self.last_ms >= every


@dataclass
class Stopping:
    """The cancelled running jobs this pool leader has told to stop (by id and admission: a
    job requeued and admitted again is told again). A new leader tells them again, which a job
    takes as it took the first."""

    told: frozenset[tuple[str, int | None]] = frozenset()

    def due(self, view: PoolView) -> tuple[JobView, ...]:
        """The jobs to tell now: running, asked to cancel, their record not ended (one that
        never formed, or stopped, schedule() ends at once), not told yet. Forgets the jobs
        that no longer need telling."""
        wanted = {
            (job.id, job.status.admitted_ms): job
            for job in view.jobs.values()
            if job.status.state is PoolJobState.RUNNING
            and not job.status.pinned
            and job.cancel is not None
            and job.record_state is not None
            and not job.record_state.terminal
        }
        self.told = self.told.intersection(wanted)
        return tuple(job for key, job in wanted.items() if key not in self.told)

    def sent(self, job: JobView) -> None:
        self.told = self.told | {(job.id, job.status.admitted_ms)}


@dataclass(frozen=True)
class Deadline:
    """What a job's time limit asks now: send it `signal` (its warning), or stop it (None)."""

    job: str
    signal: str | None
    reason: str


def deadlines(view: PoolView) -> tuple[PoolView, dict[str, PoolJob], tuple[Deadline, ...]]:
    """The running jobs whose time limit (or its signal) is due: the view as it is once they
    are sent what they are due, their statuses (to write), and what to send."""
    due: list[Deadline] = []
    statuses: dict[str, PoolJob] = {}
    for job in view.jobs.values():
        found = _deadline(job, view.now_ms)
        if found is not None:
            deadline, statuses[job.id] = found
            due.append(deadline)
    if not statuses:
        return view, {}, ()
    jobs = {j: replace(job, status=statuses.get(j, job.status)) for j, job in view.jobs.items()}
    return replace(view, jobs=jobs), statuses, tuple(due)


def _deadline(job: JobView, now_ms: int) -> tuple[Deadline, PoolJob] | None:
    status, limit = job.status, job.time_limit_ms
    admitted = status.admitted_ms
    if status.state is not PoolJobState.RUNNING or status.pinned or limit is None:
        return None
    if admitted is None or status.time_up_ms is not None:
        return None
    ran = now_ms - admitted
    text = format_duration(limit / 1000)
    if ran >= limit:
        reason = f"time limit of {text} reached: stopping (its workers get the stop grace)"
        return Deadline(job.id, None, reason), replace(status, time_up_ms=now_ms, reason=reason)
    if job.signal is None or status.signalled_ms is not None:
        return None
    name, before_ms = job.signal
    if ran < limit - before_ms:
        return None
    reason = f"SIG{name} sent {format_duration(before_ms / 1000)} before its time limit of {text}"
    return Deadline(job.id, name, reason), replace(status, signalled_ms=now_ms, reason=reason)


def account(
    view: PoolView,
    placements: Mapping[str, str],
    statuses: Mapping[str, PoolJob],
    shares: Mapping[str, Mapping[str, int]] | None = None,
) -> dict[str, PoolJob]:
    """Node-time and GPU-time held by each job: at every change of its node count (admission,
    growth, shrinking, a lost node, its end) what it held since its last change (`view`'s
    placements) is added to its node_ms and gpu_ms. A node counts the units a job asks for
    (`gpus_per_node`), or all the units it offers for a whole-node or exclusive job; a node a
    job shares, the units it holds there. `placements`, `statuses` and `shares`: as this round
    leaves them; returns the statuses that changed. The nodes are counted for every job, the
    GPUs only for those whose node count changed (bench/schedule.py's 10,000 nodes)."""
    shares = shares or {}
    before, after = _nodes(view.placements, view.shares), _nodes(placements, shares)
    moved = {j for j in statuses if before.get(j, 0) != after.get(j, 0)}
    if not moved:
        return {}
    gpus_before = _gpus(view, view.placements, view.shares, moved)
    gpus_after = _gpus(view, placements, shares, moved)
    now, changed = view.now_ms, {}
    for job_id in moved:
        status = statuses[job_id]
        since = status.accounted_ms if status.accounted_ms is not None else now
        span = max(0, now - since)
        changed[job_id] = replace(
            status,
            node_ms=status.node_ms + before.get(job_id, 0) * span,
            gpu_ms=status.gpu_ms + gpus_before.get(job_id, 0) * span,
            accounted_ms=now,
            peak_nodes=max(status.peak_nodes, after.get(job_id, 0)),
            peak_gpus=max(status.peak_gpus, gpus_after.get(job_id, 0)),
        )
    return changed


def _nodes(placements: Mapping[str, str], shares: Mapping[str, Mapping[str, int]]) -> Counter[str]:
    """Each job's nodes: placed on it whole, or shared."""
    found = Counter(placements.values())
    found.update(job for held in shares.values() for job in held)
    return found


def _gpus(
    view: PoolView,
    placements: Mapping[str, str],
    shares: Mapping[str, Mapping[str, int]],
    jobs: set[str],
) -> dict[str, int]:
    """The GPU units each of `jobs` holds in `placements` and `shares`."""
    found: dict[str, int] = {}
    for held in shares.values():
        for job_id, units in held.items():
            if job_id in jobs:
                found[job_id] = found.get(job_id, 0) + units
    for node_id, job_id in placements.items():
        if job_id in jobs:
            found[job_id] = found.get(job_id, 0) + view.whole_gpus(node_id, job_id)
    return found
