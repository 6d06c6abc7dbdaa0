"""The agent's loop (job/agent.py) against an in-memory job store: no Redis, no processes.

Several real Agents share one MemoryJobStore (tests/helpers/memstore.py) and a clock the test
moves; each node's workers are a fake group that starts and stops at once
(tests/helpers/agentloop.py). Each scenario is a
table row: what happens to the job, and the record and worker starts it must end with. The
same agents against a real redis-server and real processes: tests/integration/test_agents.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from nodeagent.model.job import Command, CommandType
from nodeagent.state import JobState
from nodeagent.supervisor.status import GroupPhase
from tests.helpers.agentloop import Job


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
