"""The stream listener (coord/listener.py) against a real redis-server: a follower is woken by
its job's wake stream only, a leader by the events and commands too."""

from __future__ import annotations

import threading

from nodeagent.coord.client import connect
from nodeagent.coord.keys import JobKeys
from nodeagent.coord.listener import StreamListener
from nodeagent.coord.store import JobStore
from nodeagent.job.plan import LeaderMemory, Plan
from nodeagent.model.job import NodeReport
from nodeagent.state import JobState, NodeState
from tests.helpers.cluster import RedisServer
from tests.helpers.factories import make_record


def test_a_follower_wakes_on_the_wake_stream_and_a_leader_on_events_too(
    redis_server: RedisServer, job_id: str
) -> None:
    keys = JobKeys("nodeagent", job_id)
    store = JobStore(connect(redis_server.url, 2.0), keys)
    raw = redis_server.client()
    leading = threading.Event()
    woken = threading.Semaphore(0)
    listener = StreamListener(
        JobStore(connect(redis_server.url, 10.0), keys),
        lambda: (keys.wake, keys.events, keys.commands) if leading.is_set() else (keys.wake,),
        woken.release,
        block_ms=200,
    )
    listener.start(ready_within=2.0)
    try:
        raw.xadd(keys.events, {"event": "{}"})
        assert not woken.acquire(timeout=0.6)  # a follower does not read every node's events
        snap = store.sync(
            NodeReport(name="a", address="127.0.0.1", state=NodeState.READY, lease_ttl_ms=5000)
        )
        assert snap.leader is not None
        plan = Plan(make_record(JobState.RESTARTING, 1), (), (), LeaderMemory(), "test")
        store.commit(snap.leader, snap.rev, plan)  # a new record: its revision on wake
        assert woken.acquire(timeout=2.0)
        last = raw.xrevrange(keys.wake, count=1)
        assert last and last[0][1] == {"rev": "1"}
        leading.set()
        store.wake("leader a")  # what an agent that becomes leader does
        assert woken.acquire(timeout=2.0)
        raw.xadd(keys.events, {"event": "{}"})
        assert woken.acquire(timeout=2.0)  # a leader does
    finally:
        listener.stop()
