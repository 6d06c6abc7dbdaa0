"""The pool leader's requests served on a thread of their own (pool/serving.py) against a real
redis-server: answered while the leader's rounds run back to back on the same pool, with nothing
a round writes undoing what a request did (a submission, a cancel, an id taken over); a term
fenced stops the serving until the next."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from nodeagent.coord.pool import PoolStore
from nodeagent.coord.requests import RequestStore
from nodeagent.model.pool import PoolJobState
from nodeagent.model.request import Verb
from nodeagent.pool import leadership
from nodeagent.pool.schedule import SchedulePolicy
from nodeagent.pool.serving import RequestServer
from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.poolrequests import answered, leader_of, spec


@contextmanager
def rounding(store: PoolStore, leader: str) -> Iterator[Callable[[], int]]:
    """The pool leader's rounds, back to back on a thread, until the block ends; yields how many
    have run."""
    stop, count = threading.Event(), [0]
    views = leadership.NodeViews()

    def rounds() -> None:
        while not stop.is_set():
            leadership.lead(store, leader, SchedulePolicy(), views)
            count[0] += 1

    thread = threading.Thread(target=rounds, daemon=True)
    thread.start()
    try:
        yield lambda: count[0]
    finally:
        stop.set()
        thread.join(60)


def test_requests_are_answered_while_rounds_run_and_no_round_undoes_one(
    redis_server: RedisServer, job_id: str
) -> None:
    store, leader, leading, signed, _ = leader_of(redis_server, f"{job_id}-pool")
    requests = RequestStore(store.client, store.keys)
    queued = [f"{job_id}-q{i:03d}" for i in range(200)]
    for name in queued:
        requests.send(signed(Verb.SUBMIT, spec(name)))
    server = RequestServer(leading)
    server.lead(leader)
    try:
        with rounding(store, leader) as rounds:
            wait_for(lambda: rounds() >= 2, 60, "two rounds")
            first = requests.send(signed(Verb.SUBMIT, spec(job_id)))
            assert answered(requests, first).ok
            cancel = requests.send(signed(Verb.CANCEL, {"job": job_id}))
            assert answered(requests, cancel).ok

            def cancelled() -> bool:
                status = store.status(job_id)
                return status is not None and status.state is PoolJobState.CANCELLED

            wait_for(cancelled, 60, f"a round to end {job_id}")
            ended = store.status(job_id)
            again = requests.send(signed(Verb.SUBMIT, spec(job_id)))  # its id taken over
            reply = answered(requests, again)
            assert reply.ok, reply
            now = rounds()
            wait_for(lambda: rounds() >= now + 2, 60, "two rounds more")
    finally:
        server.stop()
    assert ended is not None
    status = store.status(job_id)
    assert status is not None and status.state is PoolJobState.PENDING, status
    assert status.seq > ended.seq, (status, ended)  # the new job's, not the ended one's
    statuses = store.read().jobs
    assert all(statuses[name].state is PoolJobState.PENDING for name in queued)
    assert statuses[queued[0]].reason, statuses[queued[0]]  # a round said why each waits


def test_a_term_fenced_stops_the_serving_until_the_next(
    redis_server: RedisServer, job_id: str
) -> None:
    store, leader, leading, signed, _ = leader_of(redis_server, f"{job_id}-pool")
    requests = RequestStore(store.client, store.keys)
    server = RequestServer(leading, retry_s=0.1)
    server.lead(leader)
    try:
        assert answered(requests, requests.send(signed(Verb.SUBMIT, spec(f"{job_id}-1")))).ok
        store.client.set(store.keys.leader, "n1 another-term")  # another node took the lease
        late = requests.send(signed(Verb.SUBMIT, spec(f"{job_id}-2")))
        wait_for(lambda: server.fenced == leader, 30, "the serving to find its term over")
        assert requests.reply(late) is None  # not answered by a leader that no longer leads
        server.lead(leader)  # the same term again: refused once, not served again
        assert requests.reply(late) is None
        store.client.set(store.keys.leader, leader.replace(" ", " next-"))
        server.lead(leader.replace(" ", " next-"))  # this node leads again, in a new term
        assert answered(requests, late).ok
    finally:
        server.stop()
    assert store.status(f"{job_id}-2") is not None
