"""What the pool leader does about ended jobs. Pure.

- A job id may be submitted again once its job has ended: the new job is stored `stale_keys`
  (coord/poolscripts.POOL_SUBMIT) and the pool leader clears the ended job's own keys before
  admitting it (`unstale`: which jobs, and their statuses without the mark).
- Ended jobs are kept for `pool.keep_ended`, then pruned with their history (`prunable`); the
  history of reused ids is pruned by the same horizon, at most once per `PRUNE_EVERY_MS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from nodeagent.model.pool import PoolJob, PoolJobState
from nodeagent.pool.schedview import PoolView

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
