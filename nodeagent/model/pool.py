"""What a pool keeps in Redis: each node's pool report, each job's pool status. Pure.

Plain frozen dataclasses with strict JSON codecs (nodeagent.model.decode), like nodeagent.model.job:
anything read back that is not what nodeagent writes raises CorruptStateError naming the field.
A job's own protocol (record, generations, leases) stays under the job's keys; the pool only
decides which nodes serve which job.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any

from nodeagent.config.container import ContainerRule, offer, read_offer
from nodeagent.errors import CorruptStateError
from nodeagent.model.decode import NAME_RE, Reader
from nodeagent.model.gpus import MAX_UNITS, GpuUnit, read_units
from nodeagent.model.job import GpuSummary

MAX_LABELS = 64
MAX_REFUSED = 64


class PoolJobState(str, Enum):
    """A job's state in the pool.

    PENDING    submitted; waits until at least min_nodes free nodes can be given at once.
    RUNNING    admitted: nodes are placed on it and run it through the job protocol.
    SUCCEEDED  every worker of its last generation exited 0. Its nodes went back to the pool.
    FAILED     restarts exhausted or rendezvous timed out. Its nodes went back to the pool.
    CANCELLED  `nodeagentctl cancel` (or `stop`): its workers got the stop grace to checkpoint.
    TIMEOUT    it reached its time limit (`submit --time`): it was stopped as a cancel stops a
               job (its workers got the stop grace), after its `--signal` if it had one.
    """

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"

    @property
    def ended(self) -> bool:
        return self not in (PoolJobState.PENDING, PoolJobState.RUNNING)


_JOB_STATES = tuple(s.value for s in PoolJobState)


@dataclass(frozen=True)
class PoolNode:
    """What one agent publishes to the pool under its TTL key at every heartbeat.

    `pinned`: the job of this node's `job:` section (the node serves only it). `serving`: the
    job this node's agent runs now. `unfit`: why it cannot take a job (its GPUs). `refused`:
    jobs this node cannot run (the spec's user is not allowed here, or the spec is invalid), with
    why; the scheduler places them elsewhere. `containers`: what its `containers:` section allows
    (config.container.offer; None: an agent that does not say), so `submit` refuses a container
    no node would run. `pulling`: the image of the job placed here, pulled before it starts.
    `gpus`: the GPU units it offers (model/gpus.py), each with the job whose workers hold it.
    `sharing`: the jobs sharing it (each on units of its own) whose agents run here now.
    `memory`, `mem_per_gpu`: what it offers its jobs in memory (model/resources.py's
    NodeOffer: the bytes they share, the default share of a GPU unit); 0: not said (an
    agent older than these fields), and the scheduler counts no memory there. `cpus_per_gpu`:
    the CPUs each GPU unit holds of its own (model/cores.py); 0: none held, or not said, and
    the scheduler counts no CPUs there (its agent refuses a job asking more than it holds).
    """

    name: str
    address: str
    lease_ttl_ms: int
    labels: dict[str, str] = field(default_factory=dict)
    pinned: str | None = None
    serving: str | None = None
    unfit: str | None = None
    refused: dict[str, str] = field(default_factory=dict)
    metrics: str | None = None
    version: str = ""
    pulling: str | None = None
    containers: ContainerRule | None = None
    gpus: tuple[GpuUnit, ...] = ()
    sharing: tuple[str, ...] = ()  # the jobs that share it whose agents run here now
    memory: int = 0
    mem_per_gpu: int = 0
    cpus_per_gpu: int = 0
    gpu: GpuSummary | None = None  # its GPU verdicts, without readings (None: not said)

    def to_json(self) -> str:
        doc = asdict(self)
        doc["containers"] = offer(self.containers) if self.containers is not None else None
        doc["gpus"] = [unit.to_data() for unit in self.gpus]
        return json.dumps(doc, separators=(",", ":"), sort_keys=True)

    @functools.cached_property
    def digest(self) -> str:
        """A new one marks the node changed, so the pool leader reads it (poolscripts.POOL_SYNC)."""
        return hashlib.blake2b(self.to_json().encode(), digest_size=8).hexdigest()

    @classmethod
    def from_json(cls, raw: str | bytes) -> PoolNode:
        """Raises: CorruptStateError, and nothing else."""
        r = Reader.of(raw, "pool node report")
        labels = r.mapping("labels")
        refused = r.mapping("refused")
        if len(labels) > MAX_LABELS or len(refused) > MAX_REFUSED:
            raise CorruptStateError("pool node report: too many labels or refused jobs")
        if not all(isinstance(v, str) for v in [*labels.values(), *refused.values()]):
            raise CorruptStateError("pool node report: labels and refused hold strings")
        offered = r.raw("containers")
        try:
            containers = read_offer(offered) if offered is not None else None
        except ValueError as exc:
            raise CorruptStateError(f"pool node report: {exc}") from None
        return cls(
            name=r.name("name"),
            address=r.host("address"),
            lease_ttl_ms=r.integer("lease_ttl_ms", low=1, high=86_400_000),
            labels={str(k): str(v)[:256] for k, v in labels.items()},
            pinned=r.opt_text("pinned", 63),
            serving=r.opt_text("serving", 63),
            unfit=r.opt_text("unfit", 1024),
            refused={str(k)[:63]: str(v)[:1024] for k, v in refused.items()},
            metrics=r.opt_text("metrics", 300),
            version=r.text("version", "", max_len=64),
            pulling=r.opt_text("pulling", 1024),
            containers=containers,
            gpus=read_units(r, "gpus"),
            sharing=_job_names(r.items("sharing", MAX_UNITS)),
            memory=r.integer("memory", 0),
            mem_per_gpu=r.integer("mem_per_gpu", 0),
            cpus_per_gpu=r.integer("cpus_per_gpu", 0),
            gpu=GpuSummary.read(verdicts) if (verdicts := r.obj("gpu")) is not None else None,
        )


def _job_names(items: list[Any]) -> tuple[str, ...]:
    if not all(isinstance(i, str) and NAME_RE.match(i) for i in items):
        raise CorruptStateError("pool node report: sharing holds job ids")
    return tuple(items)


@dataclass(frozen=True)
class PoolJob:
    """The pool's status of one job (the pool leader writes it; `submit` creates it pending).

    `seq`: submission order (first come, first served). `reason`: why it waits, or how it ended.
    `evicted`: set while a job evicted for another waits to be admitted again (by whom, why).
    `shrunk_ms`, `grown_ms`: when the scheduler last took nodes from it for another job
    (preemption by shrinking) or gave it free nodes: its resize cooldown counts from them.
    `stale_keys`: submitted under the name of an ended job whose own keys (record, events) may
    still be there: the pool leader clears them before it admits this one.
    `signalled_ms`, `time_up_ms`: when the pool leader sent the job its time limit's signal,
    and stopped it at its time limit (it ends as TIMEOUT); both cleared at each admission.
    """

    state: PoolJobState
    seq: int
    submitted_ms: int
    reason: str = ""
    admitted_ms: int | None = None
    ended_ms: int | None = None
    pinned: bool = False  # submitted by nodes' job: sections; follows its record, never ends
    shrunk_ms: int | None = None
    grown_ms: int | None = None
    evicted: str | None = None  # pending again after an eviction: by whom and why
    stale_keys: bool = False  # a reused name: the earlier job's own keys are cleared first
    signalled_ms: int | None = None
    time_up_ms: int | None = None
    exit_code: int | None = None  # once ended: its record's (JobRecord.exit_code), if it formed
    # Accounting (pool/lifecycle.py, account): node-milliseconds held so far, counted up to
    # `accounted_ms` (the last change of its node or GPU count), and the most nodes it held at
    # once.
    node_ms: int = 0
    accounted_ms: int | None = None
    peak_nodes: int = 0
    gpu_ms: int = 0  # ... and GPU-unit-milliseconds, the most units held at once
    peak_gpus: int = 0
    # Once ended: its effective training time ratio (model/goodput.py), as the pool leader
    # accounted it from the job's events as it ended; None: not accounted (no generation ran).
    ettr: float | None = None

    def to_json(self) -> str:
        # its fields as they are (all flat): asdict's deep copy took most of a round's commit
        data: dict[str, Any] = dict(vars(self))
        data["state"] = self.state.value
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> PoolJob:
        """Raises: CorruptStateError, and nothing else."""
        r = Reader.of(raw, "pool job")
        return cls(
            state=PoolJobState(r.choice("state", _JOB_STATES)),
            seq=r.integer("seq"),
            submitted_ms=r.integer("submitted_ms"),
            reason=r.text("reason", "", max_len=1024),
            admitted_ms=r.opt_integer("admitted_ms"),
            ended_ms=r.opt_integer("ended_ms"),
            pinned=r.flag("pinned", False),
            shrunk_ms=r.opt_integer("shrunk_ms"),
            grown_ms=r.opt_integer("grown_ms"),
            evicted=r.opt_text("evicted", 1024),
            stale_keys=r.flag("stale_keys", False),
            signalled_ms=r.opt_integer("signalled_ms"),
            time_up_ms=r.opt_integer("time_up_ms"),
            exit_code=r.opt_integer("exit_code", high=255),
            node_ms=r.integer("node_ms", 0),
            accounted_ms=r.opt_integer("accounted_ms"),
            peak_nodes=r.integer("peak_nodes", 0, high=1_000_000),
            gpu_ms=r.integer("gpu_ms", 0),
            peak_gpus=r.integer("peak_gpus", 0, high=128_000_000),
            ettr=r.number("ettr", 0.0, 1.0),
        )

    def with_reason(self, reason: str) -> PoolJob:
        """This status saying `reason`. A pending job's reason changes in most rounds: with
        10,000 waiting, dataclasses.replace (which calls __init__ with every field) took 40 % of
        a schedule() call; a copy of the fields is a twentieth of it."""
        changed = object.__new__(PoolJob)
        vars(changed).update(vars(self), reason=reason)
        return changed

    def moved(self, state: PoolJobState, now_ms: int, reason: str) -> PoolJob:
        if state is PoolJobState.RUNNING:
            return replace(
                self,
                state=state,
                reason=reason,
                admitted_ms=now_ms,
                ended_ms=None,
                evicted=None,
                signalled_ms=None,
                time_up_ms=None,
            )
        if state.ended:
            return replace(
                self, state=state, reason=reason, ended_ms=now_ms, exit_code=None, ettr=None
            )
        return replace(self, state=state, reason=reason)


@dataclass(frozen=True)
class Requeue:
    """`requeue JOB`: who asked, for the run admitted at `admitted_ms` (a later one ignores it)."""

    by: str
    admitted_ms: int

    def to_json(self) -> str:
        return json.dumps({"by": self.by, "admitted_ms": self.admitted_ms}, sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Requeue:
        """Raises: CorruptStateError, and nothing else."""
        r = Reader.of(raw, "requeue")
        return cls(r.text("by", max_len=256), r.integer("admitted_ms"))
