"""The agent's loop on simulated time: several real Agents on one in-memory job store
(tests/helpers/memstore.py), each node's workers a fake group that starts and stops at once,
and, where a test asks, a peer network in memory standing for their peer watches
(job/peerwatch.py): who hears whom, and what each one's beats say.

Used by tests/unit/test_agent_loop.py and test_ride_through.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from nodeagent.config.load import load_config
from nodeagent.job.agent import Agent, AgentParts
from nodeagent.job.peerwatch import Peer
from nodeagent.job.verify import RecordCheck
from nodeagent.model.job import Failure, WorkerInfo
from nodeagent.state import JobState
from nodeagent.supervisor.fence import Group
from nodeagent.supervisor.spec import WorkerSpec
from nodeagent.supervisor.status import Activity, GroupPhase, GroupStatus, Started, WorkerExit
from tests.helpers.hosts import VALID, FixedResolver
from tests.helpers.memstore import MemoryJobStore

STEP_S = 0.1  # simulated time between two passes of every agent
RUNNING = GroupPhase.RUNNING
LEASE = "3s"


class FakeWorkers:
    """One node's worker group: starts and stops at once; `crash()` ends it with exit code 1."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.generation: int | None = None
        self.phase = GroupPhase.NONE
        self.failure: Failure | None = None
        self.started: list[int] = []  # the generations started, in order
        self.rank = 0  # of its first worker
        self.signals: list[str] = []  # the signals sent to its workers, in order
        self._exits: list[WorkerExit] = []

    def start(self, generation: int, node: str, specs: list[WorkerSpec]) -> Started:
        self.generation, self.phase, self.failure = generation, GroupPhase.RUNNING, None
        self.started.append(generation)
        self.rank = specs[0].rank
        return Started(specs=tuple(specs))

    def crash(self) -> None:
        assert self.generation is not None and self.phase is GroupPhase.RUNNING
        self.phase = GroupPhase.EXITED
        self.failure = Failure(self.generation, self.node, self.rank, "exit_code", exit_code=1)
        self._exits.append(WorkerExit(self.generation, self.rank, 0, 1, None, expected=False))

    def release(self, timeout_s: float) -> None:
        self.stop(timeout_s)

    def stop(self, grace_s: float) -> None:
        if self.phase is GroupPhase.RUNNING:
            self.phase = GroupPhase.EXITED
            assert self.generation is not None
            exit = WorkerExit(self.generation, self.rank, 0, None, "SIGTERM", expected=True)
            self._exits.append(exit)

    def kill(self) -> None:
        self.stop(0.0)

    def poll(self) -> list[WorkerExit]:
        exits, self._exits = self._exits, []
        return exits

    def mark_failed(self, local_rank: int, kind: str, code: int | None = None) -> None: ...
    def dump_stacks(self, local_rank: int) -> str:
        return ""

    def stopped(self, local_rank: int) -> bool:
        return False

    def cpu_seconds(self, local_rank: int) -> float | None:
        return None

    def activity(self, local_rank: int) -> Activity | None:
        return None

    def signal(self, name: str) -> None:
        self.signals.append(name)

    def status(self) -> GroupStatus:
        return GroupStatus(self.generation, self.phase, self.failure)

    def next_deadline(self) -> float | None:
        return None

    def workers(self) -> tuple[WorkerInfo, ...]:
        return ()

    def groups(self) -> tuple[Group, ...]:
        return ()


@dataclass
class Job:
    """Agents of one job on one in-memory store, driven pass by pass on simulated time."""

    job: dict[str, Any]
    now: float = 1000.0
    net: PeerNet | None = None  # their peer watches, in memory (None: none)
    timing: dict[str, Any] = field(default_factory=dict)
    store: MemoryJobStore = field(init=False)
    agents: dict[str, Agent] = field(default_factory=dict)
    workers: dict[str, FakeWorkers] = field(default_factory=dict)
    frozen: set[str] = field(default_factory=set)  # nodes whose agent no longer runs
    # after each pass: its time, and the generation each node's workers were running in
    trained: list[tuple[float, dict[str, int]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.store = MemoryJobStore(lambda: int(self.now * 1000))

    def add(self, name: str) -> None:
        timing: dict[str, Any] = {
            "lease_ttl": LEASE,
            "heartbeat_interval": "500ms",
            "join_settle": "1s",
            **self.timing,
        }
        if self.net is None:  # no peer watch: the leases alone, and no ride-through
            timing["peer_interval"] = "off"
        data = {
            **VALID,
            "node": {"name": name, "address": f"10.0.0.{len(self.agents) + 1}"},
            "job": {**VALID["job"], **self.job},
            "timing": timing,
        }
        self.workers[name] = FakeWorkers(name)
        config = load_config(data, FixedResolver())
        store = self.store  # checked as runtime/jobrun.py checks a JobStore it makes
        store.check = RecordCheck(store.keys.record, config.job.nproc_per_node, store.read_lease)
        watch = self.net.watch(name) if self.net is not None else None
        parts = AgentParts(clock=lambda: self.now, peers=watch)
        self.agents[name] = Agent(config, self.store, self.workers[name], base_env={}, parts=parts)

    def run(self, seconds: float) -> None:
        for _ in range(round(seconds / STEP_S)):
            self.now += STEP_S
            for name, agent in self.agents.items():
                if name not in self.frozen:
                    agent.step()
            if self.net is not None:
                self.net.frozen = set(self.frozen)
            training = {
                name: w.generation
                for name, w in self.workers.items()
                if w.phase is RUNNING and w.generation is not None
            }
            self.trained.append((self.now, training))

    def run_until(self, done: Callable[[], bool], seconds: float = 30.0) -> None:
        for _ in range(round(seconds / STEP_S)):
            if done():
                return
            self.run(STEP_S)
        raise AssertionError(f"not reached in {seconds} s: record {self.store.record}")

    def overlaps(
        self, held_out: frozenset[str] = frozenset()
    ) -> list[tuple[float, dict[str, int]]]:
        """The passes after which workers of two generations were running at once, but a
        node's the others held out alive (docs/design.md, "Fast detection": its old
        generation's workers may run until it fences itself)."""
        found = []
        for at, running in self.trained:
            newest = max(running.values(), default=0)
            old = {n for n, g in running.items() if g < newest and n not in held_out}
            if old:
                found.append((at, running))
        return found

    def running(self, generation: int) -> bool:
        record = self.store.record
        members = record.members if record else ()
        return (
            record is not None
            and record.state is JobState.RUNNING
            and record.generation == generation
            and all(self.workers[m].started[-1:] == [generation] for m in members)
        )


@dataclass
class PeerNet:
    """The members' peer watches in memory: each hears the others it watches, but a frozen
    agent (silent, suspected) or across a `cut` pair (both ways)."""

    said: dict[str, tuple[int, int]] = field(default_factory=dict)
    watching: dict[str, tuple[str, ...]] = field(default_factory=dict)
    frozen: set[str] = field(default_factory=set)
    cut: set[frozenset[str]] = field(default_factory=set)

    def watch(self, name: str) -> NetWatch:
        return NetWatch(self, name)

    def hears(self, me: str, peer: str) -> bool:
        return peer not in self.frozen and frozenset((me, peer)) not in self.cut

    def isolate(self, name: str, others: Iterable[str]) -> None:
        self.cut |= {frozenset((name, other)) for other in others if other != name}


@dataclass
class NetWatch:
    """One agent's watch on the PeerNet (what PeerDuties needs of job/peerwatch.py)."""

    net: PeerNet
    name: str
    port: int = 4000
    token: str = "ab" * 8

    def watch(self, peers: Iterable[Peer]) -> None:
        self.net.watching[self.name] = tuple(p.name for p in peers)

    def suspects(self) -> frozenset[str]:
        watched = self.net.watching.get(self.name, ())
        return frozenset(p for p in watched if not self.net.hears(self.name, p))

    def tell(self, said: int, bits: int) -> None:
        self.net.said[self.name] = (said, bits)

    def fresh(self, within: float) -> frozenset[str]:
        watched = self.net.watching.get(self.name, ())
        return frozenset(p for p in watched if self.net.hears(self.name, p))

    def said(self) -> dict[str, tuple[int, int]]:
        watched = self.net.watching.get(self.name, ())
        return {
            p: self.net.said[p]
            for p in watched
            if p in self.net.said and self.net.hears(self.name, p)
        }
