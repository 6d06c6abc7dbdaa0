"""Preemption by shrinking: which running jobs give nodes to a pending one. Pure.

A pending job that does not fit takes nodes from running jobs, only those a job holds above
its `min_nodes` (it shrinks and keeps training: an in_place job keeps its survivors, a restart
job gets the stop grace to checkpoint; neither is charged a restart), from:
- jobs of lower priority (strictly; never for an equal or lower priority), lowest priority
  first, then the youngest (admitted last); never taking another queue below its guaranteed
  share;
- when the claimant's queue holds less than its guaranteed share (reclaim): jobs of queues
  above their own share, whatever their priority, never taking such a queue below its share
  nor the claimant's queue above its own.
Never a pinned job's nodes, never a node the claimant cannot use, never from a job that the
scheduler resized less than `cooldown_ms` ago (no thrash). All or nothing: if what could be
taken does not reach what the claimant needs, nothing is taken.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nodeagent.pool.model import PoolJob
from nodeagent.pool.queues import Ledger
from nodeagent.pool.schedview import JobView


@dataclass(frozen=True)
class Victim:
    job: JobView
    nodes: tuple[str, ...]  # taken from it
    why: str  # "priority 10 > 5", or "queue research below its guaranteed 4 nodes"


def cooling(status: PoolJob, now_ms: int, cooldown_ms: int) -> bool:
    """The scheduler resized the job less than `cooldown_ms` ago."""
    last = max(status.shrunk_ms or 0, status.grown_ms or 0)
    return last > 0 and now_ms - last < cooldown_ms


def victims(
    claimant: JobView,
    need: int,
    running: Sequence[JobView],
    status_of: Callable[[JobView], PoolJob],
    placed: Callable[[str], Sequence[str]],
    usable: Callable[[str], bool],
    ledger: Ledger,
    now_ms: int,
    cooldown_ms: int,
) -> list[Victim] | None:
    """The nodes to take for `claimant`, `need` of them, or None when they cannot be found.
    `running` in victim order (order()); `status_of` a job's status as of now."""
    reclaim = ledger.deficit(claimant.queue)
    surplus: dict[str, int] = {}
    taken: list[Victim] = []
    got = 0
    for job in running:
        if got >= need:
            break
        status = status_of(job)
        if job.id == claimant.id or status.pinned or cooling(status, now_ms, cooldown_ms):
            continue
        other_queue = job.queue != claimant.queue
        spare = surplus.setdefault(job.queue, ledger.surplus(job.queue))
        lower = job.priority < claimant.priority
        reclaiming = not lower and other_queue and reclaim > 0
        if not lower and not reclaiming:
            continue
        holds = placed(job.id)
        limit = min(len(holds) - job.min_nodes, need - got)
        if other_queue:
            limit = min(limit, spare)
        if reclaiming:
            limit = min(limit, reclaim)
        if limit <= 0:
            continue
        nodes = [n for n in _give_up_order(job, holds) if usable(n)][:limit]
        if not nodes:
            continue
        if other_queue:
            surplus[job.queue] = spare - len(nodes)
        if reclaiming:
            reclaim -= len(nodes)
            share = ledger.guaranteed(claimant.queue)
            why = f"queue {claimant.queue} below its guaranteed {share} nodes"
        else:
            why = f"priority {claimant.priority} > {job.priority}"
        taken.append(Victim(job, tuple(nodes), why))
        got += len(nodes)
    return taken if got >= need else None


def order(job: JobView) -> tuple[int, int, int]:
    """Victim order: lowest priority first, then the youngest (admitted last, submitted last)."""
    return (job.priority, -(job.status.admitted_ms or 0), -job.status.seq)


def _give_up_order(job: JobView, placed: Sequence[str]) -> list[str]:
    """A victim's nodes in the order it gives them up: those not (yet) members of its
    generation first, then its members from the last rank's node to the first (the node of
    rank 0, whose store the job's process group uses, last)."""
    members = [m for m in job.members if m in placed]
    others = sorted((n for n in placed if n not in job.members), reverse=True)
    return others + list(reversed(members))
