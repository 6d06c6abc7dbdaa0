"""Fair share as the pool leader keeps it (model/fairshare.py; docs/pool.md, "Fair share"):
each round it charges each user for the nodes its jobs hold, and adds weight x the user's
factor to the priority of each of its jobs before schedule() orders them. The usage lives in
the leader's memory between rounds and in Redis (`{pool}:usage`, written in its fenced commit
every SAVE_EVERY_MS), so a new leader goes on from what the last one saved."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from nodeagent.coord.errors import redis_errors
from nodeagent.coord.pool import PoolSnapshot, PoolStore
from nodeagent.errors import CorruptStateError
from nodeagent.model.fairshare import QUEUE, FairShare, Usage, charged, factors, holding
from nodeagent.pool.schedview import PoolView

SAVE_EVERY_MS = 10_000


def read_usage(store: PoolStore) -> Usage | None:
    """The usage the pool leader last saved (None: none, or not what nodeagent writes).

    Raises:
        CoordinationError: Redis could not be read.
    """
    with redis_errors("read the pool's fair-share usage"):
        raw: Any = store.client.get(store.keys.usage)
    if raw is None:
        return None
    try:
        return Usage.from_json(raw)
    except CorruptStateError:
        return None


def charge(policy: FairShare, usage: Usage, view: PoolView) -> tuple[Usage, PoolView]:
    """`usage` charged up to the view's time for the nodes each user's and each queue's jobs
    hold (as placed; on a node jobs share, the part of it their GPUs are), and the view with
    each job's boost: weight x its user's factor x its queue's. Pure."""
    users = {job_id: job.user for job_id, job in view.jobs.items()}
    queues = {job_id: QUEUE + job.queue for job_id, job in view.jobs.items()}
    parts = {  # a node jobs share: each charged its GPUs' part of it
        node: {job: units / max(1, view.nodes[node].gpus) for job, units in held.items()}
        for node, held in view.shares.items()
        if node in view.nodes
    }
    held = holding(view.placements, users, parts) | holding(view.placements, queues, parts)
    usage = charged(usage, held, view.now_ms, policy.half_life_s)
    found = factors(policy, usage, [u for u in users.values() if u] + list(queues.values()))
    jobs = {
        job_id: replace(job, fair_share=policy.weight * boost(found, job.user, job.queue))
        for job_id, job in view.jobs.items()
    }
    return usage, replace(view, jobs=jobs)


def boost(factors: Mapping[str, float], user: str, queue: str) -> float:
    """A job's fair-share factor: its user's times its queue's."""
    return factors.get(user, 1.0) * factors.get(QUEUE + queue, 1.0)


class Fairness:
    """One leader's fair share, kept between its rounds."""

    def __init__(self, policy: FairShare) -> None:
        self.policy = policy
        self._usage: Usage | None = None
        self._term: str | None = None
        self._saved_ms = 0

    def apply(
        self, store: PoolStore, leader: str, snap: PoolSnapshot, view: PoolView
    ) -> tuple[PoolView, Usage | None]:
        """The view with each job's fair-share boost, and the usage to save now (None: not
        due).

        Raises:
            CoordinationError: Redis could not be read (a new term reads the saved usage).
        """
        if self._term != leader or self._usage is None:
            saved = read_usage(store)
            start = saved if saved is not None else Usage(snap.now_ms)
            self._usage = replace(start, policy=self.policy)
            self._term, self._saved_ms = leader, snap.now_ms
        self._usage, boosted = charge(self.policy, self._usage, view)
        due = snap.now_ms - self._saved_ms >= SAVE_EVERY_MS
        return boosted, self._usage if due else None

    def saved(self, now_ms: int) -> None:
        self._saved_ms = now_ms
