"""A job's shared state in memory: the JobPort the agent's table tests run on (no Redis).

What it keeps of the SYNC and COMMIT scripts' rules (coord/scripts.py) is what the agent's
loop depends on: a lease per node renewed at each heartbeat, one leader lease with a token,
the record fenced by the leader's token and its revision, a generation that never goes back,
and a reap only of leases past their deadline. Time is the test's (`now_ms`), so a lease
lapses when the test says; so is its outages: `down` (no call reaches it) and `cut` (the nodes
whose heartbeats do not). Nothing here is garbage: the strict decoding is coord's, tested
against a real redis-server.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from nodeagent.coord.keys import JobKeys
from nodeagent.coord.replies import NodeLease, Snapshot
from nodeagent.coord.store import RecordWrite, SnapshotCheck
from nodeagent.errors import CoordinationError, FencedError
from nodeagent.model.garbage import Garbage, GarbageLog
from nodeagent.model.handout import Handout
from nodeagent.model.job import Command, Cordon, Event, JobRecord, NodeReport
from nodeagent.model.speed import NodeSpeed, SlowVerdict


def _as_read(snapshot: Snapshot, me: str) -> Snapshot:
    return snapshot


@dataclass
class Held:
    """The leader lease: `name token`, held until `deadline_ms`."""

    name: str
    token: int
    deadline_ms: int

    @property
    def value(self) -> str:
        return f"{self.name} {self.token}"


@dataclass
class MemoryJobStore:
    """One job's state, shared by the agents of a test (each holds the same object)."""

    now_ms: Callable[[], int]
    keys: JobKeys = field(default_factory=lambda: JobKeys("nodeagent", "j"))
    garbage: GarbageLog = field(default_factory=GarbageLog)
    leases: dict[str, int] = field(default_factory=dict)  # node -> deadline (ms)
    reports: dict[str, NodeReport] = field(default_factory=dict)
    leader: Held | None = None
    epoch: int = 0
    record: JobRecord | None = None
    rev: int = 0
    events: list[Event] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    cordons: dict[str, Cordon] = field(default_factory=dict)
    wakes: int = 0
    copies: dict[str, str] = field(default_factory=dict)  # node -> JSON Handout
    node_speeds: dict[str, NodeSpeed] = field(default_factory=dict)
    verdicts: dict[str, SlowVerdict] = field(default_factory=dict)
    down: bool = False  # no call reaches it (a Redis outage)
    cut: set[str] = field(default_factory=set)  # nodes whose heartbeats do not reach it

    def __post_init__(self) -> None:
        self.check: SnapshotCheck = _as_read  # the agent sets its own (job/verify.py)

    def members(self) -> tuple[str, ...]:
        return self.record.members if self.record is not None else ()

    def hand_out(
        self, leader: str, shares: Mapping[str, str], drop: Sequence[str], reset: bool
    ) -> None:
        if self.leader is None or self.leader.value != leader:
            raise FencedError(f"hand out the copies: leader lease is not {leader}")
        if reset:
            self.copies.clear()
        self.copies.update(shares)
        for name in drop:
            self.copies.pop(name, None)

    def handout(self, name: str) -> Handout | None:
        raw = self.copies.get(name)
        return Handout.from_json(raw, name) if raw is not None else None

    def put_speed(self, speed: NodeSpeed) -> None:
        self.node_speeds[speed.node] = speed

    def speeds(self) -> dict[str, NodeSpeed]:
        return dict(self.node_speeds)

    def slow_verdicts(self) -> dict[str, SlowVerdict]:
        return dict(self.verdicts)

    def write_verdicts(
        self,
        leader: str,
        put: Sequence[SlowVerdict],
        gone: Sequence[str],
        drop_speeds: Sequence[str] = (),
    ) -> None:
        if self.leader is None or self.leader.value != leader:
            raise FencedError(f"write the slow verdicts: leader lease is not {leader}")
        self.verdicts.update({v.node: v for v in put})
        for name in gone:
            self.verdicts.pop(name, None)
        for name in drop_speeds:
            self.node_speeds.pop(name, None)

    def peer_reports(self, names: Sequence[str]) -> dict[str, NodeReport]:
        now = self.now_ms()
        return {
            n: self.reports[n] for n in names if n in self.reports and self.leases.get(n, 0) > now
        }

    def depose(self, name: str, expected: str, ttl_ms: int, event: Event) -> bool:
        if self.leader is None or self.leader.value != expected:
            return False
        self.epoch += 1
        self.leader = Held(name, self.epoch, self.now_ms() + ttl_ms)
        self.events.append(event)
        return True

    def events_tail(self, count: int) -> list[Event]:
        return self.events[-count:]

    def sync(self, report: NodeReport, events: Sequence[Event] = ()) -> Snapshot:
        now, name = self.now_ms(), report.name
        if self.down or name in self.cut:
            raise CoordinationError(f"heartbeat: {name} cannot reach the store")
        self.leases[name] = now + report.lease_ttl_ms
        self.reports[name] = report
        held = self.leader
        if held is None or held.deadline_ms <= now:
            self.epoch += 1
            held = self.leader = Held(name, self.epoch, now + report.lease_ttl_ms)
        elif held.name == name:
            held.deadline_ms = now + report.lease_ttl_ms
        self.events.extend(events)
        snapshot = Snapshot(
            now_ms=now,
            leader=held.value,
            rev=self.rev,
            record=self.record,
            cordon=self.cordons.get(name),
            leader_deadline_ms=held.deadline_ms,
            stored_record=self.record,
        )
        if held.name == name:  # the leader reads every lease and the new commands
            cursor = self.record.command_cursor if self.record else ""
            commands = tuple(c for c in self.commands if c.id > cursor)
            snapshot = replace(
                snapshot,
                leases=tuple(self._lease(n) for n in sorted(self.leases)),
                commands=commands,
                command_cursor=commands[-1].id if commands else None,
            )
        return self.check(snapshot, name)

    @property
    def generation(self) -> int:
        return self.record.generation if self.record is not None else 0

    def _lease(self, name: str) -> NodeLease:
        return NodeLease(name, self.leases[name], self.reports.get(name))

    def read_lease(self, name: str, snapshot: Snapshot, found: list[Garbage]) -> NodeLease | None:
        return self._lease(name) if name in self.leases else None

    def commit(
        self, leader: str, rev: int, plan: RecordWrite, replacing_garbage: bool = False
    ) -> int:
        now = self.now_ms()
        if self.down:
            raise CoordinationError("leader write: the store is down")
        if self.leader is None or self.leader.value != leader or self.leader.deadline_ms <= now:
            raise FencedError(f"{leader} does not hold the leader lease")
        if rev != self.rev:
            raise FencedError(f"the record moved: revision {self.rev}, not {rev}")
        record = plan.record
        going_back = record is not None and record.generation < self.generation
        if going_back and not replacing_garbage:
            raise FencedError("the generation would go back")
        if any(self.leases.get(name, 0) > now for name in plan.reap):
            raise FencedError("a reaped node renewed its lease")
        for name in plan.reap:
            self.leases.pop(name, None)
            self.reports.pop(name, None)
        for name, _ in plan.drop:
            self.leases.pop(name, None)
        self.events.extend(plan.events)
        if record is not None:
            self.record = record
        self.rev += 1
        return self.rev

    def leave(self, name: str, event: Event) -> None:
        self.leases.pop(name, None)
        self.reports.pop(name, None)
        self.events.append(event)
        if self.leader is not None and self.leader.name == name:
            self.leader = None

    def send(self, command: Command) -> None:
        """An operator's command (`nodeagentctl scale`), with a stream-like id."""
        self.commands.append(replace(command, id=f"{len(self.commands) + 1:012d}-0"))

    def wake(self, why: str) -> None:
        self.wakes += 1

    def cordon(self, name: str, cordon: Cordon) -> None:
        self.cordons[name] = cordon

    def uncordon(self, name: str, by: str) -> bool:
        return self.cordons.pop(name, None) is not None
