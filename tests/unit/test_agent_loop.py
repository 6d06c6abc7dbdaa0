"""The agent's loop (job/agent.py) against an in-memory job store: no Redis, no processes.

Several real Agents share one MemoryJobStore (tests/helpers/memstore.py) and a clock the test
moves; each node's workers are a fake group that starts and stops at once. Each scenario is a
table row: what happens to the job, and the record and worker starts it must end with. The
same agents against a real redis-server and real processes: tests/integration/test_agents.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from nodeagent.config.load import load_config
from nodeagent.job.agent import Agent, AgentParts
from nodeagent.job.verify import RecordCheck
from nodeagent.model.job import Command, CommandType, Failure, WorkerInfo
from nodeagent.state import JobState
from nodeagent.supervisor.fence import Group
from nodeagent.supervisor.spec import WorkerSpec
from nodeagent.supervisor.status import Activity, GroupPhase, GroupStatus, Started, WorkerExit
from tests.helpers.hosts import VALID, FixedResolver
from tests.helpers.memstore import MemoryJobStore

STEP_S = 0.1  # simulated time between two passes of every agent
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
    store: MemoryJobStore = field(init=False)
    agents: dict[str, Agent] = field(default_factory=dict)
    workers: dict[str, FakeWorkers] = field(default_factory=dict)
    frozen: set[str] = field(default_factory=set)  # nodes whose agent no longer runs

    def __post_init__(self) -> None:
        self.store = MemoryJobStore(lambda: int(self.now * 1000))

    def add(self, name: str) -> None:
        data = {
            **VALID,
            "node": {"name": name, "address": f"10.0.0.{len(self.agents) + 1}"},
            "job": {**VALID["job"], **self.job},
            "timing": {"lease_ttl": LEASE, "heartbeat_interval": "500ms", "join_settle": "1s"},
        }
        self.workers[name] = FakeWorkers(name)
        config = load_config(data, FixedResolver())
        store = self.store  # checked as runtime/jobrun.py checks a JobStore it makes
        store.check = RecordCheck(store.keys.record, config.job.nproc_per_node, store.read_lease)
        parts = AgentParts(clock=lambda: self.now)
        self.agents[name] = Agent(config, self.store, self.workers[name], base_env={}, parts=parts)

    def run(self, seconds: float) -> None:
        for _ in range(round(seconds / STEP_S)):
            self.now += STEP_S
            for name, agent in self.agents.items():
                if name not in self.frozen:
                    agent.step()

    def run_until(self, done: Callable[[], bool], seconds: float = 30.0) -> None:
        for _ in range(round(seconds / STEP_S)):
            if done():
                return
            self.run(STEP_S)
        raise AssertionError(f"not reached in {seconds} s: record {self.store.record}")

    def running(self, generation: int) -> bool:
        record = self.store.record
        members = record.members if record else ()
        return (
            record is not None
            and record.state is JobState.RUNNING
            and record.generation == generation
            and all(self.workers[m].started[-1:] == [generation] for m in members)
        )


def form(job: Job, nodes: tuple[str, ...]) -> None:
    for name in nodes:
        job.add(name)
    job.run_until(lambda: job.running(1))


def crash_b(job: Job) -> None:
    job.workers["b"].crash()


def lose_b(job: Job) -> None:
    job.frozen.add("b")  # its agent stops: its lease lapses on the store's clock


def scale_to_2(job: Job) -> None:
    job.store.send(Command(CommandType.SCALE, target=2, by="test"))


SCENARIOS = [
    # (what happens, job config, nodes, fault, members after, generation, restarts used)
    ("nothing", {"min_nodes": 2, "max_nodes": 3}, ("a", "b", "c"), None, ("a", "b", "c"), 1, 0),
    ("a worker crash", {"min_nodes": 2, "max_nodes": 3}, ("a", "b", "c"), crash_b, 3, 2, 1),
    ("a lost node", {"min_nodes": 2, "max_nodes": 3}, ("a", "b", "c"), lose_b, ("a", "c"), 2, 0),
    ("scale 3 -> 2", {"min_nodes": 1, "max_nodes": 3}, ("a", "b", "c"), scale_to_2, 2, 2, 0),
]


@pytest.mark.parametrize(
    ("what", "job_config", "nodes", "fault", "members", "generation", "restarts"),
    SCENARIOS,
    ids=[s[0] for s in SCENARIOS],
)
def test_the_job_forms_and_reforms(
    what: str,
    job_config: dict[str, Any],
    nodes: tuple[str, ...],
    fault: Callable[[Job], None] | None,
    members: tuple[str, ...] | int,
    generation: int,
    restarts: int,
) -> None:
    job = Job(job_config)
    form(job, nodes)
    assert job.store.record is not None and set(job.store.record.members) == set(nodes)
    if fault is not None:
        fault(job)
    job.run_until(lambda: job.running(generation))
    job.run(2.0)  # and it stays there
    record = job.store.record
    assert record is not None and record.state is JobState.RUNNING
    assert record.generation == generation and record.restart_count == restarts
    if isinstance(members, int):
        assert len(record.members) == members
    else:
        assert set(record.members) == set(members)
    for name in record.members:  # every member started every generation it was part of, once
        assert job.workers[name].started == sorted(set(job.workers[name].started))
        assert job.workers[name].started[-1] == generation
        assert job.workers[name].phase is GroupPhase.RUNNING


def test_the_leader_lost_is_replaced_and_the_job_reforms_without_it() -> None:
    job = Job({"min_nodes": 2, "max_nodes": 3})
    form(job, ("a", "b", "c"))
    leader = job.store.leader
    assert leader is not None
    job.frozen.add(leader.name)
    job.run_until(lambda: job.running(2))
    assert job.store.leader is not None and job.store.leader.name != leader.name
    assert job.store.record is not None and leader.name not in job.store.record.members


def test_a_job_below_its_minimum_waits_and_starts_nothing() -> None:
    job = Job({"min_nodes": 3, "max_nodes": 3})
    for name in ("a", "b"):
        job.add(name)
    job.run(5.0)
    assert job.store.record is None or job.store.record.state is not JobState.RUNNING
    assert [job.workers[n].started for n in ("a", "b")] == [[], []]
    job.add("c")
    job.run_until(lambda: job.running(1))


def test_a_node_that_leaves_is_dropped_without_using_a_restart() -> None:
    job = Job({"min_nodes": 1, "max_nodes": 2})
    form(job, ("a", "b"))
    job.agents["b"].request_stop()
    job.run_until(lambda: job.agents["b"].left)
    job.run_until(lambda: job.running(2))
    record = job.store.record
    assert record is not None and record.members == ("a",) and record.restart_count == 0


def test_a_signal_command_reaches_every_member_s_workers_once() -> None:
    job = Job({"min_nodes": 2, "max_nodes": 3})
    form(job, ("a", "b", "c"))
    job.store.send(Command(CommandType.SIGNAL, by="pool", signal="USR1"))
    job.run_until(lambda: all(w.signals for w in job.workers.values()))
    job.run(2.0)  # and only once, with no new generation
    assert {n: w.signals for n, w in job.workers.items()} == {n: ["USR1"] for n in "abc"}
    record = job.store.record
    assert record is not None and record.generation == 1 and record.signal == "USR1"
    job.workers["b"].crash()  # a later generation is not sent the earlier one's signal
    job.run_until(lambda: job.running(2))
    job.run(1.0)
    assert [w.signals for w in job.workers.values()] == [["USR1"]] * 3
