"""What the job's agent needs of the job's shared state (JobPort) and of its workers
(WorkerGroup). coord/store.py's JobStore satisfies the first against Redis,
tests/helpers/memstore.py's MemoryJobStore in memory; supervisor/group.py's Supervisor the
second, a fake in the tests. So the agent's loop is table-tested without a network or processes
(tests/unit/test_agent_loop.py), as torch elastic tests its rendezvous against an in-memory
backend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from nodeagent.coord.keys import JobKeys
from nodeagent.coord.replies import NodeLease, Snapshot
from nodeagent.coord.store import RecordWrite, SnapshotCheck
from nodeagent.model.garbage import Garbage, GarbageLog
from nodeagent.model.handout import Handout
from nodeagent.model.job import Cordon, Event, NodeReport, WorkerInfo
from nodeagent.model.speed import NodeSpeed, SlowVerdict
from nodeagent.supervisor.fence import Group
from nodeagent.supervisor.spec import WorkerSpec
from nodeagent.supervisor.status import Activity, GroupStatus, Started, WorkerExit


class JobPort(Protocol):
    """The job's state as one node reads and writes it. Every call may raise CoordinationError
    (the state cannot be reached); `commit` raises FencedError when this node no longer leads
    or the record moved since `rev`."""

    keys: JobKeys
    garbage: GarbageLog  # garbage read is reported once, counted through the agent's metrics
    check: SnapshotCheck  # what this node may act on (job/verify.py), applied in `sync`

    def sync(self, report: NodeReport, events: Sequence[Event] = ()) -> Snapshot:
        """Heartbeat: publish `report`, renew this node's lease, take or keep the leader lease,
        append `events`, read the record (and, as leader, every lease and new command)."""

    def read_lease(self, name: str, snapshot: Snapshot, found: list[Garbage]) -> NodeLease | None:
        """One node's lease and report, for a node whose snapshot holds none."""

    def members(self) -> tuple[str, ...]:
        """The record's members, read whole (a follower's record names only its own place)."""

    def peer_reports(self, names: Sequence[str]) -> dict[str, NodeReport]:
        """The reports of the nodes named whose lease holds (garbage left out)."""

    def commit(
        self, leader: str, rev: int, plan: RecordWrite, replacing_garbage: bool = False
    ) -> int:
        """Write the leader's plan, fenced by its token and the record's revision; the new one."""

    def hand_out(
        self, leader: str, shares: Mapping[str, str], drop: Sequence[str], reset: bool
    ) -> None:
        """Write nodes their shares of the copies (node -> JSON Handout), drop those of `drop`,
        fenced by the leader's token; `reset`: every other share goes first."""

    def handout(self, name: str) -> Handout | None:
        """Node `name`'s share of the copies (None: none written)."""

    def events_tail(self, count: int) -> list[Event]:
        """The job's newest `count` events, oldest first."""

    def put_speed(self, speed: NodeSpeed) -> None:
        """This node's pace over its last window (job/speed.py)."""

    def speeds(self) -> dict[str, NodeSpeed]:
        """Every node's latest window, garbage left out."""

    def slow_verdicts(self) -> dict[str, SlowVerdict]:
        """The nodes the leader named slow."""

    def write_verdicts(
        self,
        leader: str,
        put: Sequence[SlowVerdict],
        gone: Sequence[str],
        drop_speeds: Sequence[str] = (),
    ) -> None:
        """Write and remove slow verdicts, drop the speeds of `drop_speeds`, fenced by the
        leader's token."""

    def leave(self, name: str, event: Event) -> None: ...
    def depose(self, name: str, expected: str, ttl_ms: int, event: Event) -> bool: ...
    def wake(self, why: str) -> None: ...
    def cordon(self, name: str, cordon: Cordon) -> None: ...
    def uncordon(self, name: str, by: str) -> bool: ...


class WorkerGroup(Protocol):
    """What the agent needs from the supervisor (a seam for tests)."""

    def start(self, generation: int, node: str, specs: list[WorkerSpec]) -> Started: ...
    def release(self, timeout_s: float) -> None: ...
    def stop(self, grace_s: float) -> None: ...
    def kill(self) -> None: ...
    def poll(self) -> list[WorkerExit]: ...
    def mark_failed(self, local_rank: int, kind: str, code: int | None = None) -> None: ...
    def dump_stacks(self, local_rank: int) -> str: ...
    def stopped(self, local_rank: int) -> bool: ...
    def cpu_seconds(self, local_rank: int) -> float | None: ...
    def activity(self, local_rank: int) -> Activity | None: ...
    def signal(self, name: str) -> None: ...
    def status(self) -> GroupStatus: ...
    def next_deadline(self) -> float | None: ...
    def workers(self) -> tuple[WorkerInfo, ...]: ...
    def groups(self) -> tuple[Group, ...]: ...
