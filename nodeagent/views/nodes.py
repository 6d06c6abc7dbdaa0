"""The pool's nodes as rows (`nodeagentctl nodes`, GET /v1/nodes): the job each serves,
health, its GPU units and the job holding each, its memory for jobs, cordon, labels, heartbeat
age, address and its agent's version."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from nodeagent.coord.pool import PoolStore
from nodeagent.errors import NotFoundError
from nodeagent.model.job import GpuSummary


def nodes(store: PoolStore) -> list[dict[str, Any]]:
    snap = store.read(jobs=False)  # 10,000 jobs' statuses were most of a listing's read
    rows: list[dict[str, Any]] = []
    for name, deadline in sorted(snap.deadlines.items()):
        report = snap.nodes.get(name)
        ttl = report.lease_ttl_ms if report else 0
        cordon = snap.cordons.get(name)
        rows.append(
            {
                "name": name,
                "alive": report is not None,
                "job": snap.placements.get(name),  # placed on it whole
                "shares": dict(snap.shares.get(name, {})),  # or: job -> the GPUs it holds here
                "serving": report.serving if report else None,
                "pulling": report.pulling if report else None,
                "health": (report.unfit or gpu_health(report.gpu) or "ok") if report else "lost",
                "gpu": asdict(report.gpu) if report and report.gpu else None,  # its verdicts
                "gpus": [unit.to_data() for unit in report.gpus] if report else [],
                # what its jobs share in memory (bytes), and a GPU unit's default share of it:
                # what the scheduler counts (null: not said, an older agent)
                "memory": (report.memory or None) if report else None,
                "mem_per_gpu": (report.mem_per_gpu or None) if report else None,
                "cpus_per_gpu": (report.cpus_per_gpu or None) if report else None,
                "cordon": cordon.reason if cordon else None,
                "drained": cordon.drain if cordon else False,
                "labels": dict(report.labels) if report else {},
                "heartbeat_age_s": (snap.now_ms - (deadline - ttl)) / 1000 if report else None,
                "address": report.address if report else None,
                "version": report.version if report else None,  # its agent's (an upgrade)
            }
        )
    return rows


def gpu_health(summary: GpuSummary | None) -> str | None:
    """What a node's GPU verdicts say against it ("GPU 3 unhealthy: ..."), or None: all
    healthy, or not said."""
    bad = [g for g in (summary.gpus if summary else ()) if g.health != "healthy"]
    return "; ".join(f"GPU {g.index} {g.health}: {g.reason}" for g in bad) or None


def pool_node_health(store: PoolStore, name: str) -> dict[str, Any]:
    """A pool node's health as its pool heartbeat says it, whatever job it serves or none
    (`nodeagentctl health --node N`, the job's own status document aside): its pool cordon,
    why it is unfit, its GPU verdicts.

    Raises:
        NotFoundError: no live pool lease of that node.
    """
    snap = store.read(jobs=False)
    report = snap.nodes.get(name)
    if report is None:
        raise NotFoundError(f"node {name} is not in pool {store.keys.pool} (no live pool lease)")
    cordon = snap.cordons.get(name)
    return {
        "cordon": {"reason": cordon.reason, "by": cordon.by} if cordon else None,
        "unfit": report.unfit,
        "gpu": asdict(report.gpu) if report.gpu else None,
    }
