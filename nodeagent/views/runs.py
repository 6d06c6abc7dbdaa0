"""A pool job's run as show and history give it (every face): its spec and status as one row
(user, times, nodes, node-hours, GPUs and GPU-hours, exit code). Times are RFC 3339 (UTC)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nodeagent.model.accounting import exit_code
from nodeagent.model.pool import PoolJob
from nodeagent.model.spec import JobSpec
from nodeagent.views.documents import rfc3339


@dataclass(frozen=True)
class Run:
    """One run of a job as the pool keeps it: its id, spec and status."""

    job: str
    spec: JobSpec | None
    status: PoolJob

    def node_hours(self, now_ms: int, placed: int) -> float:
        """Node-hours held so far (the nodes placed now counted up to `now_ms`)."""
        since = self.status.accounted_ms
        held = self.status.node_ms + (placed * max(0, now_ms - since) if since else 0)
        return held / 3_600_000

    def row(self, now_ms: int, placed: int = 0) -> dict[str, Any]:
        status, spec = self.status, self.spec
        start, end = status.admitted_ms, status.ended_ms
        elapsed = None if start is None else ((end or now_ms) - start) / 1000
        return {
            "job": self.job,
            "seq": status.seq,
            "user": spec.user if spec else None,
            "kind": spec.kind if spec else None,
            "state": status.state.value,
            "queue": spec.queue if spec else None,
            "priority": spec.priority if spec else None,
            "submitted": rfc3339(status.submitted_ms),
            "started": rfc3339(start),
            "ended": rfc3339(end),
            "elapsed_s": elapsed,
            "nodes": status.peak_nodes,
            "node_hours": round(self.node_hours(now_ms, placed), 4),
            # the most GPU units it held at once, and GPU-hours as accounted so far (None: its
            # nodes offered no GPU), as its accounting record keeps them (model/accounting.py)
            "gpus": status.peak_gpus or None,
            "gpu_hours": round(status.gpu_ms / 3_600_000, 4) if status.peak_gpus else None,
            "exit_code": exit_code(status),
            "reason": status.reason,
            "ettr": status.ettr,  # once ended (model/goodput.py)
        }
