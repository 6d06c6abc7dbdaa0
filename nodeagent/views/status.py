"""The job's status as a plain document (what `nodeagentctl status --json` prints and GET
/v1/jobs/{job}/status returns): status_document is pure; job_status and node_health read it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from nodeagent.coord.pool import PoolStore
from nodeagent.coord.store import JobStore, NodeLease, Snapshot
from nodeagent.errors import NotFoundError
from nodeagent.job.checkpoints import replication
from nodeagent.job.checkpoints.restore import memory_steps
from nodeagent.model.job import JobRecord, NodeReport
from nodeagent.model.speed import NodeSpeed, SlowVerdict
from nodeagent.state import JobState
from nodeagent.views.documents import JSON_VERSION


def _node(lease: NodeLease, now_ms: int, group_rank: int | None) -> dict[str, Any]:
    report = lease.report
    if report is None:
        return {
            "name": lease.name,
            "address": None,
            "state": "unreadable",
            "group_rank": None,
            "generation": None,
            "heartbeat_age_s": None,
            "workers": [],
            "cordon": None,
            "unfit": None,
            "gpu": None,
            "tier": None,
        }
    heartbeat_ms = lease.deadline_ms - report.lease_ttl_ms
    expired = lease.deadline_ms <= now_ms
    return {
        "name": lease.name,
        "address": report.address,
        "state": "lost" if expired else report.state.value,
        "group_rank": group_rank,
        "generation": report.acked_generation,
        "heartbeat_age_s": round(max(0, now_ms - heartbeat_ms) / 1000, 3),
        "restart_count": report.restart_count,
        "last_error": report.last_error,
        "cordon": asdict(report.cordon) if report.cordon else None,
        "unfit": report.unfit,
        "gpu": asdict(report.gpu) if report.gpu else None,
        "metrics": report.metrics,
        "tier": _tier(report),
        "workers": [
            {
                "rank": w.rank,
                "local_rank": w.local_rank,
                "pid": w.pid,
                "state": w.state,
                "exit_code": w.exit_code,
            }
            for w in report.workers
        ],
    }


def _tier(report: NodeReport) -> dict[str, Any] | None:
    if report.tier is None:
        return None
    persisted = [h.step for h in report.tier.persisted]
    return {"memory": report.tier.newest_memory(), "persisted": max(persisted, default=None)}


def checkpoints(record: JobRecord | None, snapshot: Snapshot) -> dict[str, Any] | None:
    """The job's tiers: the newest step whole in memory for the running members, the newest
    whole in the persistent tier, this generation's restore order, the steps never restored,
    the committed step (on replicas + 1 nodes) and the ranks of it short of that."""
    if record is None or record.checkpoint is None:
        return None
    reports = {lease.name: lease.report for lease in snapshot.leases if lease.report is not None}
    whole = memory_steps(record.members, record.nproc_per_node, reports) if record.members else []
    tiers = record.checkpoint
    short = replication.under_replicated(
        replication.holdings(reports), tiers.committed, tiers.replicas
    )
    return {
        "memory": whole[0][0] if whole else None,
        "persisted": tiers.persisted_step,
        "restore": list(tiers.restore),
        "bad": list(tiers.bad),
        "replicas": tiers.replicas,
        "committed": tiers.committed_step,
        # ranks of the committed step on fewer than replicas + 1 live nodes (a node lost: the
        # survivors are copying them again)
        "under_replicated": short if tiers.replicas else [],
    }


def _speed(speed: NodeSpeed | None, verdict: SlowVerdict | None) -> dict[str, Any]:
    """A node's last speed window and, if the leader named it slow, why."""
    return {
        "speed": {k: v for k, v in asdict(speed).items() if k not in ("node", "seq")}
        if speed
        else None,
        "slow": {k: v for k, v in asdict(verdict).items() if k != "node"} if verdict else None,
    }


def status_document(
    snapshot: Snapshot,
    job: str,
    speeds: Mapping[str, NodeSpeed] | None = None,
    slow: Mapping[str, SlowVerdict] | None = None,
) -> dict[str, Any]:
    """`speeds`, `slow`: the job's speed hash and slow verdicts (coord/speeds.py)."""
    record = snapshot.record
    running = record is not None and record.state is JobState.RUNNING
    speeds, slow = speeds or {}, slow or {}
    nodes = [
        _node(lease, snapshot.now_ms, record.group_rank(lease.name) if record and running else None)
        | _speed(speeds.get(lease.name), slow.get(lease.name))
        for lease in sorted(snapshot.leases, key=lambda lease: lease.name)
    ]
    return {
        "job": job,
        "state": record.state.value if record else JobState.WAITING.value,
        "reason": record.reason if record else "no agent has formed the job yet",
        "detail": record.detail if record else "",
        "generation": record.generation if record else 0,
        "world_size": record.world_size if record else 0,
        "target_nodes": record.target_nodes if record else None,
        "min_nodes": record.min_nodes if record else None,
        "max_nodes": record.max_nodes if record else None,
        "nproc_per_node": record.nproc_per_node if record else None,
        "restart_count": record.restart_count if record else 0,
        "max_restarts": record.max_restarts if record else None,
        "members": list(record.members) if record and running else [],
        "master": f"{record.master_addr}:{record.master_port}" if record and running else None,
        "leader": snapshot.leader_name,
        "record_error": snapshot.record_error,
        "garbage": [g.describe() for g in snapshot.garbage],
        "checkpoints": checkpoints(record, snapshot),
        "slow_nodes": sorted(slow),
        "nodes": nodes,
    }


def job_status(store: JobStore, pool: PoolStore) -> dict[str, Any]:
    """`nodeagentctl status`, GET /v1/jobs/{job}/status: the job's status document with its
    place in the pool (why it waits, was shrunk or evicted)."""
    doc = {
        "version": JSON_VERSION,
        **status_document(store.snapshot(), store.keys.job, store.speeds(), store.slow_verdicts()),
    }
    pooled = pool.status(store.keys.job)
    doc["pool"] = (
        {"pool": pool.keys.pool, "state": pooled.state.value, "reason": pooled.reason}
        if pooled is not None
        else None
    )
    return doc


def node_health(store: JobStore, name: str) -> dict[str, Any]:
    """One node of the job's status document (its cordon, why it is unfit, its GPU verdicts).

    Raises:
        NotFoundError: no live lease of that node in the job.
    """
    nodes = {n["name"]: n for n in status_document(store.snapshot(), store.keys.job)["nodes"]}
    if name not in nodes:
        raise NotFoundError(f"node {name} is not in job {store.keys.job} (no live lease)")
    found: dict[str, Any] = nodes[name]
    return found
