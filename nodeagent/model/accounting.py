"""An ended job's accounting record (docs/accounting.md; sacct's job record). Pure.

The pool leader makes one as a job ends, from what `history` and `show` report: who ran it,
where, for how long, on how many nodes, where its time went (model/goodput.py), how often it
restarted and why, and how it ended. It is stored in the same fenced write as the job's end
(coord/poolscripts.POOL_COMMIT: the pool's ledger), and taken from there into the accounting
database (accounting/), where `(pool, job, seq)` is its key: written once, however many
leaders take it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from nodeagent.model.decode import Reader
from nodeagent.model.goodput import Goodput
from nodeagent.model.pool import PoolJob

BY = ("user", "queue", "day")  # what `report` groups by


@dataclass(frozen=True)
class Record:
    """One ended run of a job. `gpus`: the most GPU units it held at once; `gpu_hours`: the
    units it held over time (a whole-node job holds every unit its nodes offer:
    model/gpus.py); both None where its nodes offered no GPU (no NVML there); `goodput`:
    model/goodput.Goodput.to_data(), None when no generation ran."""

    pool: str
    job: str
    seq: int
    state: str
    ended_ms: int
    user: str | None = None
    queue: str | None = None
    name: str | None = None
    array: str | None = None
    kind: str | None = None  # model/spec.py's KINDS (None: kept before kinds were)
    submitted_ms: int | None = None
    started_ms: int | None = None
    elapsed_s: float | None = None
    nodes: int = 0
    node_hours: float = 0.0
    gpus: int | None = None
    gpu_hours: float | None = None
    exit_code: int | None = None
    reason: str = ""
    ettr: float | None = None
    restarts: int = 0
    restarts_by_cause: Mapping[str, int] = field(default_factory=dict)
    goodput: Mapping[str, Any] | None = None

    @property
    def run(self) -> str:
        """The run's id in the pool: its job id and submission number."""
        return f"{self.job}:{self.seq}"

    @property
    def day(self) -> str:
        """The UTC day it ended (`report --by day`)."""
        return datetime.fromtimestamp(self.ended_ms / 1000, UTC).strftime("%Y-%m-%d")

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Record:
        """Raises: CorruptStateError, and nothing else."""
        r = Reader.of(raw, "accounting record")
        causes = r.mapping("restarts_by_cause")
        goodput = r.raw("goodput")
        return cls(
            pool=r.text("pool"),
            job=r.text("job"),
            seq=r.integer("seq"),
            state=r.text("state"),
            ended_ms=r.integer("ended_ms"),
            user=r.opt_text("user"),
            queue=r.opt_text("queue"),
            name=r.opt_text("name"),
            array=r.opt_text("array"),
            kind=r.opt_text("kind"),
            submitted_ms=r.opt_integer("submitted_ms"),
            started_ms=r.opt_integer("started_ms"),
            elapsed_s=r.number("elapsed_s"),
            nodes=r.integer("nodes"),
            node_hours=r.real("node_hours"),
            gpus=r.opt_integer("gpus"),
            gpu_hours=r.number("gpu_hours"),
            exit_code=r.opt_integer("exit_code"),
            reason=r.text("reason", ""),
            ettr=r.number("ettr"),
            restarts=r.integer("restarts", 0),
            restarts_by_cause={str(k): int(v) for k, v in causes.items() if isinstance(v, int)},
            goodput=goodput if isinstance(goodput, dict) else None,
        )


def record_of(
    pool: str,
    job_id: str,
    status: PoolJob,
    restarts_by_cause: Mapping[str, int],
    goodput: Goodput | None,
    *,
    user: str | None,
    queue: str | None,
    name: str | None,
    array: str | None,
    kind: str | None = None,
) -> Record:
    """The record of `job_id`'s run that ends with `status` (its node-time accounted up to its
    end: pool/lifecycle.account), submitted as `user` to `queue`, named `name`, a task of
    `array`."""
    start, end = status.admitted_ms, status.ended_ms or 0
    return Record(
        pool=pool,
        job=job_id,
        seq=status.seq,
        state=status.state.value,
        ended_ms=end,
        user=user,
        queue=queue,
        name=name,
        array=array,
        kind=kind,
        submitted_ms=status.submitted_ms,
        started_ms=start,
        elapsed_s=None if start is None else max(0, end - start) / 1000,
        nodes=status.peak_nodes,
        node_hours=status.node_ms / 3_600_000,
        gpus=status.peak_gpus or None,  # None: its nodes advertised no GPU (no NVML there)
        gpu_hours=status.gpu_ms / 3_600_000 if status.peak_gpus else None,
        exit_code=exit_code(status),
        reason=status.reason,
        ettr=status.ettr,
        restarts=sum(restarts_by_cause.values()),
        restarts_by_cause=dict(restarts_by_cause),
        goodput=goodput.to_data() if goodput is not None else None,
    )


def exit_code(status: PoolJob) -> int | None:
    """A run's exit code as sacct gives it: 0 for success, its workers' (or 1) otherwise;
    None while it has not ended."""
    if not status.state.ended:
        return None
    if status.state.value == "succeeded":
        return 0
    return status.exit_code or 1
