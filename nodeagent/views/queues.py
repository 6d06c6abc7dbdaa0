"""The pool's queues as rows (`nodeagentctl queue list`, GET /v1/queues): quota, GPU quota,
guarantees (nodes, GPUs), and the nodes, GPUs and jobs each holds now."""

from __future__ import annotations

from typing import Any

from nodeagent.coord.pool import PoolStore
from nodeagent.model.gpus import gpus_needed
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
    gpus: dict[str, int] = {}  # the GPU units each queue's jobs hold (as its GPU quota counts)
    for node, job in snap.placements.items():
        report, spec = snap.nodes.get(node), specs.get(job)
        if report is not None and not isinstance(spec, str) and spec is not None:
            held = gpus_needed(spec.gpus_per_node, len(report.gpus), spec.exclusive)
            gpus[spec.queue] = gpus.get(spec.queue, 0) + held
    for held_by in snap.shares.values():
        for job, units in held_by.items():
            if job in queue_of:
                gpus[queue_of[job]] = gpus.get(queue_of[job], 0) + units
    found = []
    for name, queue in sorted(queues.items()):
        jobs = [j for j in live if queue_of.get(j) == name]
        found.append(
            {
                "queue": name,
                "quota": queue.quota,
                "gpu_quota": queue.gpu_quota,
                "gpus": gpus.get(name, 0),
                "guaranteed": queue.guaranteed,
                "gpu_guaranteed": queue.gpu_guaranteed,
                "nodes": sum(1 for j in holders if queue_of.get(j) == name),
                "running": sum(1 for j in jobs if snap.jobs[j].state is PoolJobState.RUNNING),
                "pending": sum(1 for j in jobs if snap.jobs[j].state is PoolJobState.PENDING),
            }
        )
    return found
