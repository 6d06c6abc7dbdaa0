"""Preemption by shrinking: which running jobs give nodes to a pending one. Pure.

A pending job that does not fit takes nodes from running jobs, first only those a job holds
above its `min_nodes` (it shrinks and keeps training: an in_place job keeps its survivors, a
restart job gets the stop grace to checkpoint; neither is charged a restart); only when that is
not enough, whole jobs marked `preemptible` (evicted: they go back to pending and resume from
their checkpoints when admitted again), from:
- jobs of lower priority (strictly; never for an equal or lower priority), lowest priority
  first, then the youngest (admitted last); never taking another queue below its guaranteed
  shares (nodes, and GPU units: a node counted at the most units a node offers);
- when the claimant's queue holds less than its guaranteed share (reclaim), in nodes, or in
  GPU units (each node taken counted as the units it gives the claimant): jobs of queues
  above their own share, whatever their priority, never taking such a queue below its share
  nor the claimant's queue above its own.
Never a pinned job's nodes, never a node the claimant cannot use, never from a job that the
scheduler resized less than `cooldown_ms` ago (no thrash). All or nothing: if what could be
taken does not reach what the claimant needs, nothing is taken.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nodeagent.model.pool import PoolJob
from nodeagent.model.queues import Ledger
from nodeagent.pool.schedview import JobView


@dataclass(frozen=True)
class Victim:
    job: JobView
    nodes: tuple[str, ...]  # taken from it (evicted: all it holds)
    why: str  # "priority 10 > 5", or "queue research below its guaranteed 4 nodes"
    evict: bool = False


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
    widest: int = 0,
) -> list[Victim] | None:
    """The nodes to take for `claimant`, `need` of them, or None when they cannot be found.
    `running` in victim order (order()); `status_of` a job's status as of now; `widest` the
    most GPU units a node offers (a node taken from a queue with a guaranteed GPU share counts
    that many against it: never fewer than it held there)."""
    taking = _Taking(claimant, ledger, widest)
    candidates = []
    for job in running:
        status = status_of(job)
        if job.id == claimant.id or status.pinned or cooling(status, now_ms, cooldown_ms):
            continue
        if status.admitted_ms == now_ms:  # admitted in this round: not taken back in it
            continue
        why = taking.why(job)
        if why is not None:
            candidates.append((job, why))
    for job, why in candidates:  # first, shrink
        if taking.got >= need:
            return taking.found
        holds = placed(job.id)
        limit = taking.limit(job, min(len(holds) - job.min_nodes, need - taking.got))
        nodes = [n for n in _give_up_order(job, holds) if usable(n)][:limit] if limit > 0 else []
        taking.take(Victim(job, tuple(nodes), why), sum(1 for _ in nodes))
    for job, why in candidates:  # then, evict whole preemptible jobs
        if taking.got >= need:
            break
        if not job.preemptible:
            continue
        holds = tuple(placed(job.id))
        gain = sum(1 for n in holds if usable(n)) - taking.taken_from(job.id)
        if gain > 0 and taking.limit(job, len(holds)) >= len(holds):
            taking.take(Victim(job, holds, why, evict=True), gain)
    return taking.found if taking.got >= need else None


class _Taking:
    """What one claimant has taken so far, and what the queues' shares still allow."""

    def __init__(self, claimant: JobView, ledger: Ledger, widest: int) -> None:
        self.claimant, self.ledger, self.widest = claimant, ledger, widest
        self.reclaim = ledger.deficit(claimant.queue)
        self.by_gpus = False  # reclaiming the queue's guaranteed GPUs, not its nodes
        by_gpus = reclaim_by_gpus(claimant, ledger, widest)
        if by_gpus > self.reclaim:
            self.reclaim, self.by_gpus = by_gpus, True
        self.surplus: dict[str, int] = {}
        self.gpu_surplus: dict[str, int] = {}  # of queues with a guaranteed GPU share
        self.victims: dict[str, Victim] = {}
        self.got = 0

    @property
    def found(self) -> list[Victim]:
        return [v for v in self.victims.values() if v.nodes]

    def why(self, job: JobView) -> str | None:
        """Why `job` may give nodes to the claimant, or None."""
        claimant = self.claimant
        if job.priority < claimant.priority:
            return f"priority {claimant.priority} > {job.priority}"
        if job.queue != claimant.queue and self.reclaim > 0:
            if self.by_gpus:
                share = self.ledger.gpu_guaranteed(claimant.queue)
                return f"queue {claimant.queue} below its guaranteed {share} GPUs"
            share = self.ledger.guaranteed(claimant.queue)
            return f"queue {claimant.queue} below its guaranteed {share} nodes"
        return None

    def _reclaiming(self, job: JobView) -> bool:
        return job.priority >= self.claimant.priority

    def limit(self, job: JobView, wanted: int) -> int:
        """At most `wanted`, within what the queues' shares allow to take from `job`."""
        if job.queue != self.claimant.queue:
            spare = self.surplus.setdefault(job.queue, self.ledger.surplus(job.queue))
            wanted = min(wanted, spare + self.taken_from(job.id))
            if self.widest and self.ledger.gpu_guaranteed(job.queue):
                units = self.gpu_surplus.setdefault(job.queue, self.ledger.gpu_surplus(job.queue))
                wanted = min(wanted, units // self.widest + self.taken_from(job.id))
        if self._reclaiming(job):
            wanted = min(wanted, self.reclaim + self.taken_from(job.id))
        return wanted

    def taken_from(self, job_id: str) -> int:
        victim = self.victims.get(job_id)
        return len(victim.nodes) if victim is not None else 0

    def take(self, victim: Victim, gain: int) -> None:
        """Record `victim` (replacing a shrink of the same job by its eviction)."""
        job, before = victim.job, self.taken_from(victim.job.id)
        added = len(victim.nodes) - before
        if job.queue != self.claimant.queue:
            self.surplus[job.queue] = self.surplus.get(job.queue, 0) - added
            if job.queue in self.gpu_surplus:
                self.gpu_surplus[job.queue] -= added * self.widest
        if self._reclaiming(job):
            self.reclaim -= added
        self.victims[job.id] = victim
        self.got += gain


def reclaim_by_gpus(claimant: JobView, ledger: Ledger, widest: int) -> int:
    """The nodes `claimant` may reclaim for its queue's guaranteed GPU share: as many as keep
    the queue within it, each node counted as the units it gives the claimant (its
    `gpus_per_node` where it shares nodes; a whole node, the most units a node offers)."""
    units = (claimant.gpus_per_node or 0) if claimant.shared else widest
    return ledger.gpu_deficit(claimant.queue) // units if units > 0 else 0


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
