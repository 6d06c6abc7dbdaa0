"""What agents write to and read from Redis: node reports, the job record, events, commands.

Plain frozen dataclasses with a strict JSON codec (nodeagent.model.decode). Anything read back that
is not what nodeagent writes (a wrong type, an out-of-range or non-finite number, "false" for a
boolean, 2.9 for a count) raises CorruptStateError naming the field, and the decoders raise
nothing else, so garbage in Redis is reported, never trusted and never crashes an agent.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any

from nodeagent.config.values import parse_signal, size_text
from nodeagent.errors import ConfigError, CorruptStateError
from nodeagent.model.decode import MAX_NAMES, MAX_RAW, Reader, is_stream_id
from nodeagent.model.stalls import RankStall, WaitedOn
from nodeagent.model.tiers import CheckpointRecord, TierReport
from nodeagent.state import JOB_TRANSITIONS, JobState, NodeState, check_transition

# parked, leaving: an in_place worker told to leave its generation has (not yet) left it.
WORKER_STATES = ("running", "exited", "failed", "stopping", "leaving", "parked", "warming")
FAILURE_KINDS = ("exit_code", "signal", "hang", "xid", "oom")
MAX_LEASE_TTL_MS = 86_400_000
WATCH_TOKEN_CHARS = 16  # a peer watch's token: 8 random bytes, in hexadecimal
_CODE = 1 << 31  # exit codes, signals and XIDs stay within an int32
_MEMORY = 1 << 62  # bytes a cgroup may be limited to (cgroup v2's max is 2^63 - 1)


@dataclass(frozen=True)
class WorkerInfo:
    rank: int
    local_rank: int
    pid: int | None
    state: str  # WORKER_STATES
    exit_code: int | None = None

    @classmethod
    def read(cls, r: Reader) -> WorkerInfo:
        return cls(
            rank=r.integer("rank"),
            local_rank=r.integer("local_rank", high=65535),
            pid=r.opt_integer("pid", 1, _CODE),
            state=r.choice("state", WORKER_STATES),
            exit_code=r.opt_integer("exit_code", -_CODE, _CODE),
        )


CAUSE_MAX = 600  # characters of a failure's cause kept and published


@dataclass(frozen=True)
class Failure:
    """A worker failure in one generation, as the node that saw it reports it."""

    generation: int
    node: str
    rank: int
    kind: str  # exit_code | signal | hang | xid | oom (its job's cgroup ran out of memory)
    exit_code: int | None = None
    signal: str | None = None
    # Why, when the rank said so: the exception its @record wrote (TORCHELASTIC_ERROR_FILE), or
    # for a rank that failed in its first seconds (an import error, a bad argument) its last
    # lines of output. And where its whole output is, on its node.
    cause: str | None = None
    log: str | None = None
    memory_limit: int | None = None  # oom: what the job's workers on the node may use (bytes)

    @classmethod
    def read(cls, r: Reader) -> Failure:
        return cls(
            generation=r.integer("generation"),
            node=r.name("node"),
            rank=r.integer("rank"),
            kind=r.choice("kind", FAILURE_KINDS),
            exit_code=r.opt_integer("exit_code", -_CODE, _CODE),
            signal=r.opt_text("signal", 32),
            cause=r.opt_text("cause", CAUSE_MAX),
            log=r.opt_text("log", 4096),
            memory_limit=r.opt_integer("memory_limit", 0, _MEMORY),
        )

    def describe(self) -> str:
        if self.kind == "hang":
            return f"rank {self.rank} on {self.node} hung (no progress beat)"
        if self.kind == "xid":
            return f"rank {self.rank} on {self.node}: application XID {self.exit_code} on its GPU"
        where = f" (log: {self.log} on {self.node})" if self.log else ""
        if self.kind == "oom":
            limit = f"{size_text(self.memory_limit)}" if self.memory_limit else "its limit"
            return (
                f"rank {self.rank} on {self.node} ran out of memory (its job's limit there: "
                f"{limit}; ask for more with mem_per_gpu or mem){where}"
            )
        how = f"signal {self.signal}" if self.signal else f"exit code {self.exit_code}"
        cause = f": {self.cause}" if self.cause else ""
        return f"rank {self.rank} on {self.node} failed ({how}){cause}{where}"


@dataclass(frozen=True)
class Cordon:
    """A node kept out of new generations; with `drain` it also leaves the running one."""

    reason: str
    by: str  # "gpu" when the agent cordoned itself, else who ran nodeagentctl
    drain: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def read(cls, r: Reader) -> Cordon:
        return cls(reason=r.text("reason"), by=r.text("by", max_len=256), drain=r.flag("drain"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> Cordon:
        """Raises: CorruptStateError (so do all decoders here), and nothing else."""
        return cls.read(Reader.of(raw, "cordon"))


def cordon_event(node: str, cordon: Cordon) -> Event:
    """What a cordon (or a drain) of `node` appends to the events of its job or pool."""
    return Event(
        f"node_{'drained' if cordon.drain else 'cordoned'}",
        node=node,
        message=f"{cordon.reason} (by {cordon.by})",
        data={"by": cordon.by, "drain": cordon.drain},
    )


def uncordon_event(node: str, by: str) -> Event:
    return Event("node_uncordoned", node=node, message=f"by {by}", data={"by": by})


@dataclass(frozen=True)
class GpuInfo:
    """One GPU's verdict as a node reports it."""

    index: int
    health: str
    action: str
    reason: str
    temperature_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None

    @classmethod
    def read(cls, r: Reader) -> GpuInfo:
        return cls(
            index=r.integer("index", high=4096),
            health=r.text("health", max_len=64),
            action=r.text("action", max_len=64),
            reason=r.text("reason"),
            temperature_c=r.number("temperature_c", -300, 1000),
            power_w=r.number("power_w", 0, 100_000),
            sm_clock_mhz=r.opt_integer("sm_clock_mhz", high=100_000),
            sm_clock_max_mhz=r.opt_integer("sm_clock_max_mhz", high=100_000),
        )


@dataclass(frozen=True)
class GpuSummary:
    available: bool
    reason: str = ""  # why monitoring is unavailable
    gpus: tuple[GpuInfo, ...] = ()

    @classmethod
    def read(cls, r: Reader) -> GpuSummary:
        return cls(
            available=r.flag("available"),
            reason=r.text("reason", ""),
            gpus=tuple(GpuInfo.read(g) for g in r.objects("gpus")),
        )


@dataclass(frozen=True)
class NodeReport:
    """What one agent publishes under its TTL key at every heartbeat."""

    name: str
    address: str
    state: NodeState
    acked_generation: int = 0
    worker_generation: int | None = None
    group_rank: int | None = None  # its group rank in its workers' generation
    group_size: int = 0  # how many members that generation has (0: no workers)
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
    tier: TierReport | None = None  # the job's checkpoint tiers on this node (job.checkpoint)
    # Its peer watch (job/peerwatch.py): the port its beats are served on (0: none) and the
    # token they carry; the members it suspects lost (job/suspicion.py).
    watch_port: int = 0
    watch_token: str | None = None
    suspects: tuple[str, ...] = ()
    # In place: its workers' replacements still starting outside any generation (warm-ups,
    # supervisor/group.py); the leader goes on without it meanwhile (members.ready).
    warming: int = 0
    # Its ranks silent past their step times (job/stalls.py). Empty in a healthy job.
    stalls: tuple[RankStall, ...] = ()
    # The peers it watches whose beats say their workers of a generation ended: (name, that
    # generation). A member riding through a Redis outage is awaited until such word of it
    # (job/ridethrough.py).
    peers_out: tuple[tuple[str, int], ...] = ()

    @property
    def eligible(self) -> bool:
        """May be chosen for a new generation."""
        return self.cordon is None and self.unfit is None

    def to_json(self) -> str:
        data = asdict(self)
        data["state"] = self.state.value
        return json.dumps(data, separators=(",", ":"))

    @functools.cached_property
    def digest(self) -> str:
        """What changes when anything the leader plans from changes, and only then: the report
        without its GPUs' readings (temperature, power and clock move at every heartbeat; their
        verdicts do not). A heartbeat with a new digest marks the node changed (scripts.SYNC),
        and the leader reads it again."""
        gpu = self.gpu and replace(
            self.gpu,
            gpus=tuple(
                replace(g, temperature_c=None, power_w=None, sm_clock_mhz=None)
                for g in self.gpu.gpus
            ),
        )
        planned = replace(self, gpu=gpu).to_json().encode()
        return hashlib.blake2b(planned, digest_size=8).hexdigest()

    @classmethod
    def from_json(cls, raw: str | bytes) -> NodeReport:
        r = Reader.of(raw, "node report")
        cordon, gpu, failure = r.obj("cordon"), r.obj("gpu"), r.obj("failure")
        tier = r.obj("tier")
        report = cls(
            name=r.name("name"),
            address=r.host("address"),
            state=NodeState(r.choice("state", _NODE_STATES)),
            acked_generation=r.integer("acked_generation"),
            worker_generation=r.opt_integer("worker_generation"),
            group_rank=r.opt_integer("group_rank"),
            group_size=r.integer("group_size", 0, high=MAX_NAMES),
            free_port=r.integer("free_port", high=65535),
            restart_count=r.integer("restart_count"),
            lease_ttl_ms=r.integer("lease_ttl_ms", low=1, high=MAX_LEASE_TTL_MS),
            workers=tuple(WorkerInfo.read(w) for w in r.objects("workers")),
            failure=Failure.read(failure) if failure else None,
            succeeded_generation=r.opt_integer("succeeded_generation"),
            last_error=r.opt_text("last_error"),
            cordon=Cordon.read(cordon) if cordon else None,
            unfit=r.opt_text("unfit"),
            gpu=GpuSummary.read(gpu) if gpu else None,
            metrics=r.opt_text("metrics", 300),
            tier=TierReport.read(tier) if tier else None,
            watch_port=r.integer("watch_port", 0, high=65535),
            watch_token=r.opt_text("watch_token", WATCH_TOKEN_CHARS),
            suspects=r.names("suspects"),
            warming=r.integer("warming", 0, high=65535),
            stalls=tuple(RankStall.read(s) for s in r.objects("stalls", 65535)),
            peers_out=r.generations("peers_out"),
        )
        if report.watch_token is not None and not _is_token(report.watch_token):
            raise CorruptStateError(
                f"node report of {report.name}: watch_token {report.watch_token!r} is not "
                f"{WATCH_TOKEN_CHARS} hexadecimal digits"
            )
        if report.failure is not None and report.failure.node != report.name:
            raise CorruptStateError(
                f"node report of {report.name} carries a failure of {report.failure.node}"
            )
        return report


class RestartReason(str, Enum):
    """Why a generation was announced: the job record's `reason` from its announcement while it
    restarts and runs, its `generation_announced` and `generation_started` events' `reason`,
    and the label of `nodeagent_restarts_total` (any other text read from Redis is "other").

    WORKER_FAILED  a worker exited with an error or a signal (charged to max_restarts)
    WORKER_HUNG    a worker made no progress for hang_timeout (charged)
    WORKER_OOM     a worker's job ran out of the memory its cgroup gives it on a node (charged)
    NODE_LOST      a member's lease lapsed, or a worker failed after a member was lost (not
                   charged: a dead peer makes the survivors' collectives fail too)
    NODE_LEFT      every member that dropped out was leaving (its agent stopped)
    NODE_JOINED    nodes joined a job below its target, or a waiting job has enough
    SCALE          the target changed (nodeagentctl scale)
    OPERATOR       an operator's restart, or an operator's drain of every member that left
    GPU_FAULT      every member that left drained itself for a GPU fault
    SLOW_NODE      every member that left was drained by the slow-node policy (job/slowness.py)
    """

    WORKER_FAILED = "worker_failed"
    WORKER_HUNG = "worker_hung"
    WORKER_OOM = "worker_oom"
    NODE_LOST = "node_lost"
    NODE_LEFT = "node_left"
    NODE_JOINED = "node_joined"
    SCALE = "scale"
    OPERATOR = "operator"
    GPU_FAULT = "gpu_fault"
    SLOW_NODE = "slow_node"

    @property
    def breaks_generation(self) -> bool:
        """The generation it replaces is broken: its collectives cannot complete, so its
        workers' stop is a failure's (no stop save, nothing persisted or handed over)."""
        return self in _BREAKING

    @property
    def charged(self) -> bool:
        """A worker's failure: it counts against max_restarts and the crash streak."""
        return self in _CHARGED

    @classmethod
    def of(cls, text: str) -> RestartReason | None:
        """The reason a record or an event names (None: not a restart reason: the record of
        an ended or waiting job, or text nodeagent did not write)."""
        try:
            return cls(text)
        except ValueError:
            return None


_CHARGED = frozenset(
    {RestartReason.WORKER_FAILED, RestartReason.WORKER_HUNG, RestartReason.WORKER_OOM}
)
_BREAKING = _CHARGED | {RestartReason.NODE_LOST}
_NODE_STATES = tuple(s.value for s in NodeState)


def _is_token(text: str) -> bool:
    return len(text) == WATCH_TOKEN_CHARS and all(c in "0123456789abcdef" for c in text)


_JOB_STATES = tuple(s.value for s in JobState)


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
    checkpoint: CheckpointRecord | None = None  # a job with tiers (job.checkpoint)
    # The last SIGNAL command (its id) and the generation whose workers get it (decide.py)
    signal: str = ""
    signal_id: str = "0-0"
    signal_generation: int = 0
    # The ranks every other rank waits on (job/stalls.py): each one's node fails it as hung.
    # Empty but while that holds.
    waited_on: tuple[WaitedOn, ...] = ()
    # How long a member may train on without Redis past its fence point (timing.ride_through
    # of the leader that wrote it; 0: not at all). Members ride the shorter of this and their
    # own setting, leaders await them the longer (job/ridethrough.py).
    ride_through_ms: int = 0

    @property
    def world_size(self) -> int:
        running = self.state is JobState.RUNNING
        return len(self.members) * self.nproc_per_node if running else 0

    @property
    def exit_code(self) -> int:
        """What the job ended with, as torchrun exits: 0 when it succeeded; the failing rank's
        exit code (1-255), or 1 (a signal, a hang, a rendezvous timeout, a stop)."""
        if self.state is JobState.SUCCEEDED:
            return 0
        failure = self.pending_failure
        if failure is not None and failure.kind == "exit_code" and failure.exit_code:
            return failure.exit_code if 0 < failure.exit_code < 256 else 1
        return 1

    def group_rank(self, node: str) -> int | None:
        return self.members.index(node) if node in self.members else None

    def moved_to(self, state: JobState, **changes: Any) -> JobRecord:
        """A copy in `state`, checked against the job transition table."""
        check_transition(JOB_TRANSITIONS, self.state, state)
        return replace(self, state=state, **changes)

    def to_json(self) -> str:
        return json.dumps(self._data(), separators=(",", ":"))

    def _data(self) -> dict[str, Any]:
        if "" in self.members:  # (a leader plans from the whole record, never from this)
            raise ValueError("a record read as its head (from_head) is not written back")
        data = asdict(self)
        data["state"] = self.state.value
        data["members"] = list(self.members)
        return data

    @functools.cached_property
    def members_digest(self) -> str:
        """Names the member list of this generation: the leader writes the ranks hash again
        when it changes (store.JobStore.commit), so at every new generation too. A rank
        changed by hand to another plausible one (two nodes swapped: nobody reads 10,000 ranks
        at every heartbeat) then lasts until the next generation, which the failed rendezvous
        it causes brings about."""
        names = f"{self.generation} {' '.join(self.members)}"
        return hashlib.blake2b(names.encode(), digest_size=8).hexdigest()

    def head_json(self) -> str:
        """The record as a node that does not lead reads it: the member list cut to the rank-0
        member, with `size` for its length. At 10,000 nodes the list is 90 KB, and every node
        would read it at every new revision (0.9 GB from Redis); each reads its own rank from
        the ranks hash instead (scripts.SYNC, from_head)."""
        data = replace(self, members=self.members[:1])._data()
        data["size"] = len(self.members)
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_head(cls, raw: str | bytes, node: str, rank: int | None) -> JobRecord:
        """A record read as head_json by `node`, which holds group rank `rank` (None: it is no
        member). Its member list has the record's length but names only the rank-0 member and
        `node`, the places a member acts on (its rank, the world size, its master); the other
        places are "". Never planned from: a leader reads the whole record."""
        r = Reader.of(raw, "job record head")
        first = r.names("members")
        size = r.integer("size", high=MAX_NAMES)
        record = cls._read(r, ())
        if len(first) != min(size, 1):
            raise CorruptStateError(f"job record head: {len(first)} members named, size {size}")
        if rank is not None and rank >= size:
            raise CorruptStateError(f"job record head: rank {rank} of {node} is not below {size}")
        if (rank == 0) != (first[:1] == (node,)):
            raise CorruptStateError(
                f"job record head: the rank-0 member is {first[0] if first else 'nobody'}, "
                f"but {node}'s rank is {rank}"
            )
        members = [""] * size
        members[:1] = first
        if rank is not None:
            members[rank] = node
        return replace(record, members=tuple(members))

    @classmethod
    def from_json(cls, raw: str | bytes) -> JobRecord:
        r = Reader.of(raw, "job record")
        return cls._read(r, r.names("members"))

    @classmethod
    def _read(cls, r: Reader, members: tuple[str, ...]) -> JobRecord:
        pending, checkpoint = r.obj("pending_failure"), r.obj("checkpoint")
        return cls(
            generation=r.integer("generation"),
            state=JobState(r.choice("state", _JOB_STATES)),
            reason=r.text("reason", max_len=256),
            target_nodes=r.integer("target_nodes", low=1),
            min_nodes=r.integer("min_nodes", low=1),
            max_nodes=r.integer("max_nodes", low=1),
            nproc_per_node=r.integer("nproc_per_node", low=1, high=65535),
            max_restarts=r.integer("max_restarts"),
            restart_count=r.integer("restart_count", 0),
            members=members,
            master_addr=r.host("master_addr", ""),
            master_port=r.integer("master_port", 0, high=65535),
            since_ms=r.integer("since_ms", 0),
            command_cursor=r.stream_id("command_cursor", "0-0"),
            pending_failure=Failure.read(pending) if pending else None,
            detail=r.text("detail", "", max_len=MAX_RAW),
            checkpoint=CheckpointRecord.read(checkpoint) if checkpoint else None,
            signal=_signal_name(r.text("signal", "", max_len=16), "job record") or "",
            signal_id=r.stream_id("signal_id", "0-0"),
            signal_generation=r.integer("signal_generation", 0),
            waited_on=tuple(WaitedOn.read(w) for w in r.objects("waited_on")),
            ride_through_ms=r.integer("ride_through_ms", 0),
        )


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
        if not is_stream_id(entry_id):
            raise CorruptStateError(f"event ID {entry_id[:41]!r} is not a stream entry ID")
        r = Reader.of(raw, f"event {entry_id}")
        return cls(
            type=r.text("type", max_len=64),
            generation=r.opt_integer("generation"),
            node=r.opt_text("node", 256),
            message=r.text("message", "", max_len=MAX_RAW),
            data=r.mapping("data"),
            at_ms=int(entry_id.split("-")[0]),
            id=entry_id,
        )


class CommandType(str, Enum):
    """Operator commands, sent through the job's command stream."""

    SCALE = "scale"
    RESTART = "restart"
    STOP = "stop"
    SIGNAL = "signal"  # send `signal` to every worker's main process (a time limit's warning)


@dataclass(frozen=True)
class Command:
    type: CommandType
    target: int | None = None
    by: str = ""
    id: str = "0-0"
    signal: str | None = None  # SIGNAL: its name without SIG (USR1)

    def to_json(self) -> str:
        body: dict[str, Any] = {"type": self.type.value, "target": self.target, "by": self.by}
        if self.signal is not None:
            body["signal"] = self.signal
        return json.dumps(body)

    @classmethod
    def from_stream(cls, entry_id: str, raw: str | bytes) -> Command:
        r = Reader.of(raw, f"command {entry_id}")
        return cls(
            type=CommandType(r.choice("type", _COMMAND_TYPES)),
            target=r.opt_integer("target", high=1_000_000),
            by=r.text("by", "", max_len=256),
            id=entry_id,
            signal=_signal_name(r.opt_text("signal", 16), f"command {entry_id}"),
        )


def _signal_name(name: str | None, what: str) -> str | None:
    """A catchable signal's name (USR1) as read back, or None (none given).

    Raises: CorruptStateError for anything else."""
    if not name:
        return None
    try:
        found, _ = parse_signal(name, "signal")
    except ConfigError:
        raise CorruptStateError(f"{what}: signal {name!r} is not one a worker can catch") from None
    return found


_COMMAND_TYPES = tuple(c.value for c in CommandType)


@dataclass(frozen=True)
class ClusterView:
    """One consistent snapshot, read in a single Lua call at Redis server time `now_ms`."""

    now_ms: int
    record: JobRecord | None
    nodes: Mapping[str, NodeReport]  # live nodes: lease deadline in the future, report present
    expired: tuple[str, ...] = ()  # lease deadlines in the past: to reap
    expired_ms: Mapping[str, int] = field(default_factory=dict)  # and those deadlines
    commands: tuple[Command, ...] = ()  # after record.command_cursor
    command_cursor: str | None = None  # the last command entry read, valid or not
    drop: tuple[tuple[str, str], ...] = ()  # garbage leases: (member, score as read)
