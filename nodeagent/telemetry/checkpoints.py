"""The checkpoint tiers' metrics (docs/checkpoints.md): restores by tier, steps lost, the newest
step in each tier, the persistent copies. Part of the agent's registry (telemetry/metrics.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

RESTORE_TIERS = ("memory", "persistent", "script", "start")
REPLICA_DIRECTIONS = ("sent", "fetched")


class CheckpointMetrics:
    def __init__(self, job_id: str, registry: CollectorRegistry) -> None:
        self.job_id = job_id
        r, j = registry, ["job_id"]
        self.restores = Counter(
            "nodeagent_checkpoint_restores",
            "Generations of this node's workers started from each source",
            ["job_id", "tier"],
            registry=r,
        )
        self.refused = Counter(
            "nodeagent_checkpoint_refused",
            "Copies a local rank refused at a restore (a checksum, a NaN)",
            j,
            registry=r,
        )
        self.steps_lost = Gauge(
            "nodeagent_checkpoint_steps_lost",
            "Steps between the newest save held anywhere and the one the last restore loaded",
            j,
            registry=r,
        )
        self.restore_seconds = Gauge(
            "nodeagent_checkpoint_restore_seconds",
            "The slowest local rank's last restore (verify, load, agree)",
            j,
            registry=r,
        )
        self.step = Gauge(
            "nodeagent_checkpoint_step",
            "The newest step this node holds verified, by tier",
            ["job_id", "tier"],
            registry=r,
        )
        self.memory_bytes = Gauge(
            "nodeagent_checkpoint_memory_bytes",
            "Bytes of verified saves in this node's memory tier",
            j,
            registry=r,
        )
        self.save_blocked = Gauge(
            "nodeagent_checkpoint_save_blocked_seconds",
            "How long the newest save verified on this node held the training step (staging; "
            "the longest of the local ranks')",
            j,
            registry=r,
        )
        self.persist_seconds = Gauge(
            "nodeagent_checkpoint_persist_seconds",
            "How long this node's last copy to the persistent tier took",
            j,
            registry=r,
        )
        self.persisted_bytes = Counter(
            "nodeagent_checkpoint_persisted_bytes",
            "Bytes this node copied to the persistent tier",
            j,
            registry=r,
        )
        self.replica_bytes = Counter(
            "nodeagent_checkpoint_replica_bytes",
            "Bytes of saves this node sent to peers (sent) or brought from them to restore "
            "(fetched)",
            ["job_id", "direction"],
            registry=r,
        )
        self.replica_copies = Counter(
            "nodeagent_checkpoint_replica_copies",
            "Copies of one rank's save between this node and a peer, by direction and result",
            ["job_id", "direction", "result"],
            registry=r,
        )
        self.replica_seconds = Gauge(
            "nodeagent_checkpoint_replica_seconds",
            "How long this node's last copy to or from a peer took",
            ["job_id", "direction"],
            registry=r,
        )
        self.replication_lag = Gauge(
            "nodeagent_checkpoint_replication_lag_steps",
            "Steps between this node's newest verified save and the job's committed step "
            "(every rank on replicas + 1 nodes)",
            j,
            registry=r,
        )
        for direction in REPLICA_DIRECTIONS:
            self.replica_bytes.labels(job_id, direction)
            for result in ("ok", "failed"):
                self.replica_copies.labels(job_id, direction, result)
        for tier in RESTORE_TIERS:
            self.restores.labels(job_id, tier)
        for metric in (self.refused, self.persisted_bytes):
            metric.labels(job_id)

    def restored(self, tier: str, seconds: float, lost: int | None, refused: int) -> None:
        self.restores.labels(self.job_id, tier).inc()
        self.restore_seconds.labels(self.job_id).set(seconds)
        if lost is not None:
            self.steps_lost.labels(self.job_id).set(lost)
        if refused:
            self.refused.labels(self.job_id).inc(refused)

    def held(
        self, memory: int | None, persisted: int | None, memory_bytes: int, blocked: float | None
    ) -> None:
        if blocked is not None:
            self.save_blocked.labels(self.job_id).set(blocked)
        for tier, step in (("memory", memory), ("persistent", persisted)):
            if step is not None:
                self.step.labels(self.job_id, tier).set(step)
        self.memory_bytes.labels(self.job_id).set(memory_bytes)

    def persisted(self, seconds: float, size: int) -> None:
        self.persist_seconds.labels(self.job_id).set(seconds)
        self.persisted_bytes.labels(self.job_id).inc(size)

    def copied(self, direction: str, seconds: float, size: int, ok: bool) -> None:
        self.replica_copies.labels(self.job_id, direction, "ok" if ok else "failed").inc()
        if ok:
            self.replica_bytes.labels(self.job_id, direction).inc(size)
            self.replica_seconds.labels(self.job_id, direction).set(seconds)

    def lag(self, newest: int | None, committed: int | None) -> None:
        if newest is not None and committed is not None:
            self.replication_lag.labels(self.job_id).set(max(0, newest - committed))
