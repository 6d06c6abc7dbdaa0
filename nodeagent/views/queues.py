"""The pool's queues as rows (`nodeagentctl queue list`, GET /v1/queues): quota, guarantee,
and the nodes and jobs each holds now."""

from __future__ import annotations

from typing import Any

from nodeagent.coord.pool import PoolStore
from nodeagent.model.pool import PoolJobState
from nodeagent.model.queues import DEFAULT, QueueView


def queues(store: PoolStore) -> list[dict[str, Any]]:
    """Every queue (`default` too), with the nodes and jobs it holds now."""
    snap = store.read()
    live = [j for j, s in snap.jobs.items() if not s.state.ended]
    specs = store.specs(live)
    queue_of = {j: spec.queue for j, spec in specs.items() if not isinstance(spec, str)}
    queues = {DEFAULT: QueueView(DEFAULT), **snap.queues}
    # each node a job holds: placed on it whole, or one of the jobs sharing it (as quotas count)
    holders = [*snap.placements.values(), *(j for held in snap.shares.values() for j in held)]
    found = []
    for name, queue in sorted(queues.items()):
        jobs = [j for j in live if queue_of.get(j) == name]
        found.append(
            {
                "queue": name,
                "quota": queue.quota,
                "guaranteed": queue.guaranteed,
                "nodes": sum(1 for j in holders if queue_of.get(j) == name),
                "running": sum(1 for j in jobs if snap.jobs[j].state is PoolJobState.RUNNING),
                "pending": sum(1 for j in jobs if snap.jobs[j].state is PoolJobState.PENDING),
            }
        )
    return found
