"""What agents write to and read from Redis: node reports, the job record, events, commands.

Plain frozen dataclasses with a strict JSON codec. Anything read back that is not what nodeagent
writes raises CorruptStateError naming the field, so garbage in Redis is reported, not trusted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any

from nodeagent.errors import CorruptStateError
from nodeagent.state import JOB_TRANSITIONS, JobState, NodeState, check_transition


def _require(data: Mapping[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = data.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise CorruptStateError(f"{what}: field {name!r} is {value!r}, expected {kind}")
    return value


def _optional_int(data: Mapping[str, Any], name: str, what: str) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    return int(_require(data, name, int, what))


def _decode(raw: str | bytes, what: str) -> Mapping[str, Any]:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptStateError(f"{what} is not JSON: {raw[:80]!r}") from exc
    if not isinstance(data, dict):
        raise CorruptStateError(f"{what} is not a JSON object: {raw[:80]!r}")
    return data


@dataclass(frozen=True)
class WorkerInfo:
    rank: int
    local_rank: int
    pid: int | None
    state: str  # running | exited | failed | stopping
    exit_code: int | None = None


@dataclass(frozen=True)
class Failure:
    """A worker failure in one generation, as the node that saw it reports it."""

    generation: int
    node: str
    rank: int
    kind: str  # exit_code | signal | hang
    exit_code: int | None = None
    signal: str | None = None

    def describe(self) -> str:
        if self.kind == "hang":
            return f"rank {self.rank} on {self.node} hung (no progress beat)"
        if self.kind == "xid":
            return f"rank {self.rank} on {self.node}: application XID {self.exit_code} on its GPU"
        how = f"signal {self.signal}" if self.signal else f"exit code {self.exit_code}"
        return f"rank {self.rank} on {self.node} failed ({how})"


@dataclass(frozen=True)
class Cordon:
    """A node kept out of new generations; with `drain` it also leaves the running one."""

    reason: str
    by: str  # "gpu" when the agent cordoned itself, else who ran nodeagentctl
    drain: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Cordon:
        data = _decode(raw, "cordon")
        try:
            return cls(reason=str(data["reason"]), by=str(data["by"]), drain=bool(data["drain"]))
        except KeyError as exc:
            raise CorruptStateError(f"cordon is malformed: missing {exc}") from exc


@dataclass(frozen=True)
class GpuInfo:
    """One GPU's verdict as a node reports it."""

    index: int
    health: str
    action: str
    reason: str
    temperature_c: float | None = None
    power_w: float | None = None


@dataclass(frozen=True)
class GpuSummary:
    available: bool
    reason: str = ""  # why monitoring is unavailable
    gpus: tuple[GpuInfo, ...] = ()


@dataclass(frozen=True)
class NodeReport:
    """What one agent publishes under its TTL key at every heartbeat."""

    name: str
    address: str
    state: NodeState
    acked_generation: int = 0
    worker_generation: int | None = None
    group_rank: int | None = None
    free_port: int = 0
    restart_count: int = 0
    lease_ttl_ms: int = 0
    workers: tuple[WorkerInfo, ...] = ()
    failure: Failure | None = None
    succeeded_generation: int | None = None
    last_error: str | None = None
    cordon: Cordon | None = None
    unfit: str | None = None  # why this node cannot take part (too few usable GPUs)
    gpu: GpuSummary | None = None
    metrics: str | None = None  # host:port of this agent's /metrics

    @property
    def eligible(self) -> bool:
        """May be chosen for a new generation."""
        return self.cordon is None and self.unfit is None

    def to_json(self) -> str:
        data = asdict(self)
        data["state"] = self.state.value
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> NodeReport:
        what = "node report"
        data = _decode(raw, what)
        try:
            state = NodeState(data.get("state"))
            failure = data.get("failure")
            return cls(
                name=_require(data, "name", str, what),
                address=_require(data, "address", str, what),
                state=state,
                acked_generation=_require(data, "acked_generation", int, what),
                worker_generation=_optional_int(data, "worker_generation", what),
                group_rank=_optional_int(data, "group_rank", what),
                free_port=_require(data, "free_port", int, what),
                restart_count=_require(data, "restart_count", int, what),
                lease_ttl_ms=_require(data, "lease_ttl_ms", int, what),
                workers=tuple(WorkerInfo(**w) for w in data.get("workers") or ()),
                failure=Failure(**failure) if failure else None,
                succeeded_generation=_optional_int(data, "succeeded_generation", what),
                last_error=data.get("last_error"),
                cordon=Cordon(**data["cordon"]) if data.get("cordon") else None,
                unfit=data.get("unfit"),
                gpu=_gpu_summary(data.get("gpu")),
                metrics=data.get("metrics"),
            )
        except (TypeError, ValueError) as exc:
            raise CorruptStateError(f"{what} is malformed: {exc}") from exc


def _gpu_summary(data: Any) -> GpuSummary | None:
    if not data:
        return None
    gpus = tuple(GpuInfo(**g) for g in data.get("gpus") or ())
    return GpuSummary(bool(data["available"]), str(data.get("reason", "")), gpus)


@dataclass(frozen=True)
class JobRecord:
    """The leader's record of the job: its generation, members and counters.

    `members` is the ordered membership of the last generation that ran (group rank = index);
    while RESTARTING it still names the previous members, so survivors keep their order.
    """

    generation: int
    state: JobState
    reason: str
    target_nodes: int
    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    max_restarts: int
    restart_count: int = 0
    members: tuple[str, ...] = ()
    master_addr: str = ""
    master_port: int = 0
    since_ms: int = 0
    command_cursor: str = "0-0"
    pending_failure: Failure | None = None
    detail: str = ""

    @property
    def world_size(self) -> int:
        running = self.state is JobState.RUNNING
        return len(self.members) * self.nproc_per_node if running else 0

    def group_rank(self, node: str) -> int | None:
        return self.members.index(node) if node in self.members else None

    def moved_to(self, state: JobState, **changes: Any) -> JobRecord:
        """A copy in `state`, checked against the job transition table."""
        check_transition(JOB_TRANSITIONS, self.state, state)
        return replace(self, state=state, **changes)

    def to_json(self) -> str:
        data = asdict(self)
        data["state"] = self.state.value
        data["members"] = list(self.members)
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> JobRecord:
        what = "job record"
        data = dict(_decode(raw, what))
        try:
            data["state"] = JobState(data.get("state"))
            data["members"] = tuple(_require(data, "members", list, what))
            pending = data.get("pending_failure")
            data["pending_failure"] = Failure(**pending) if pending else None
            for name in ("generation", "target_nodes", "min_nodes", "max_nodes", "restart_count"):
                _require(data, name, int, what)
            return cls(**data)
        except (TypeError, ValueError) as exc:
            raise CorruptStateError(f"{what} is malformed: {exc}") from exc


@dataclass(frozen=True)
class Event:
    """One entry of the job's event stream. `at_ms` is Redis server time (from the stream ID)."""

    type: str
    generation: int | None = None
    node: str | None = None
    message: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)
    at_ms: int | None = None
    id: str | None = None

    def to_json(self) -> str:
        body = {k: v for k, v in asdict(self).items() if k not in ("at_ms", "id")}
        return json.dumps(body, separators=(",", ":"), default=str)

    @classmethod
    def from_stream(cls, entry_id: str, raw: str | bytes) -> Event:
        data = _decode(raw, f"event {entry_id}")
        try:
            return cls(
                type=str(data["type"]),
                generation=data.get("generation"),
                node=data.get("node"),
                message=str(data.get("message", "")),
                data=data.get("data") or {},
                at_ms=int(entry_id.split("-")[0]),
                id=entry_id,
            )
        except (KeyError, ValueError) as exc:
            raise CorruptStateError(f"event {entry_id} is malformed: {exc}") from exc


class CommandType(str, Enum):
    """Operator commands, sent through the job's command stream."""

    SCALE = "scale"
    RESTART = "restart"
    STOP = "stop"


@dataclass(frozen=True)
class Command:
    type: CommandType
    target: int | None = None
    by: str = ""
    id: str = "0-0"

    def to_json(self) -> str:
        return json.dumps({"type": self.type.value, "target": self.target, "by": self.by})

    @classmethod
    def from_stream(cls, entry_id: str, raw: str | bytes) -> Command:
        data = _decode(raw, f"command {entry_id}")
        try:
            target = data.get("target")
            return cls(
                type=CommandType(data.get("type")),
                target=int(target) if target is not None else None,
                by=str(data.get("by", "")),
                id=entry_id,
            )
        except (TypeError, ValueError) as exc:
            raise CorruptStateError(f"command {entry_id} is malformed: {exc}") from exc
