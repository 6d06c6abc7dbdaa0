"""The agent's Redis calls are bounded by the fence point and by nothing shorter.

The agent runs here with a store whose heartbeat the test controls and a worker group fake;
no Redis, no processes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import fakeredis

from nodeagent.config.load import load_config
from nodeagent.coord.keys import JobKeys
from nodeagent.coord.store import JobStore, Snapshot
from nodeagent.job.agent import Agent
from nodeagent.job.verify import RecordCheck
from nodeagent.model.job import Event, NodeReport, WorkerInfo
from nodeagent.state import NodeState
from nodeagent.supervisor.fence import Group
from nodeagent.supervisor.spec import WorkerSpec
from nodeagent.supervisor.status import Activity, GroupStatus, Started, WorkerExit
from tests.helpers.hosts import VALID, FixedResolver


class HeldStore(JobStore):
    """Each heartbeat waits for `release` (set: it answers after `delay_s`)."""

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__(fakeredis.FakeRedis(decode_responses=True), JobKeys("nodeagent", "j"))
        self.release = threading.Event()
        self.release.set()
        self.delay_s = delay_s
        self.answered = 0

    def sync(self, report: NodeReport, events: Sequence[Event] = ()) -> Snapshot:
        self.release.wait()
        time.sleep(self.delay_s)
        self.answered += 1
        return Snapshot(now_ms=int(time.time() * 1000), leader=None, rev=0, record=None)


class IdleGroup:
    """No workers, but a stop whose grace ends in `stop_in_s` (what a SIGKILL would wait for)."""

    def __init__(self, stop_in_s: float | None = None) -> None:
        self.stop_in_s = stop_in_s

    def start(self, generation: int, node: str, specs: list[WorkerSpec]) -> Started:
        raise AssertionError("no workers start here")

    def release(self, timeout_s: float) -> None: ...
    def stop(self, grace_s: float) -> None: ...
    def kill(self) -> None: ...
    def poll(self) -> list[WorkerExit]:
        return []

    def mark_failed(self, local_rank: int, kind: str, code: int | None = None) -> None: ...
    def dump_stacks(self, local_rank: int) -> str:
        return ""

    def stopped(self, local_rank: int) -> bool:
        return False

    def cpu_seconds(self, local_rank: int) -> float | None:
        return None

    def activity(self, local_rank: int) -> Activity | None:
        return None

    def signal(self, name: str) -> None: ...

    def status(self) -> GroupStatus:
        return GroupStatus()

    def next_deadline(self) -> float | None:
        return None if self.stop_in_s is None else time.monotonic() + self.stop_in_s

    def workers(self) -> tuple[WorkerInfo, ...]:
        return ()

    def groups(self) -> tuple[Group, ...]:
        return ()


def _agent(store: JobStore, group: IdleGroup, lease: str = "5s") -> Agent:
    data = {**VALID, "timing": {"lease_ttl": lease, "heartbeat_interval": "100ms"}}
    config = load_config(data, FixedResolver())
    store.check = RecordCheck(store.keys.record, config.job.nproc_per_node, store.read_lease)
    return Agent(config, store, group, base_env={})


def test_an_imminent_stop_deadline_does_not_cut_a_heartbeat_short() -> None:
    """A heartbeat that takes 30 ms succeeds although a stop's grace ends in 1 ms."""
    store = HeldStore(delay_s=0.03)
    agent = _agent(store, IdleGroup(stop_in_s=0.001))
    agent.tick()
    assert store.answered == 1
    assert agent.healthz()[0], agent.healthz()[1]


def test_a_heartbeat_with_no_reply_is_given_up_at_the_fence_point() -> None:
    """Renewed once, then Redis goes silent: the tick returns while the call is still out (it
    never returns until released) and the node is fenced."""
    store = HeldStore()
    agent = _agent(store, IdleGroup(), lease="400ms")  # fence point: 200 ms after the renewal
    agent.tick()
    assert store.answered == 1
    store.release.clear()
    try:
        time.sleep(0.1)
        agent.tick()  # the call is out: this tick returns at the fence point, not with the call
        assert store.answered == 1
        assert agent.state is NodeState.FENCED
        agent.tick()  # the call is still out: the next fails at once, the node stays fenced
        assert agent.state is NodeState.FENCED and store.answered == 1
    finally:
        store.release.set()
