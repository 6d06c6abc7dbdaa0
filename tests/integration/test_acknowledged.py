"""What the pool acknowledges, it keeps (issue 79): a change answered "done" is on the replicas
pool.durability asks for, else answered "not acknowledged" (coord/durable.py); a request that
arrives again (a retry, a copy) is the change it repeats, never a second one (pool/retries.py,
the submit script's request id). Against a real redis-server and a real replica of it."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from nodeagent.coord.durable import Durability, NotAcknowledged
from nodeagent.coord.keys import PoolKeys
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.requests import RequestStore
from nodeagent.model.request import Verb
from nodeagent.model.spec import load_spec
from tests.helpers.cluster import RedisServer, nodeagentctl, wait_for
from tests.helpers.poolrequests import leader_of, spec

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisServer]]:
    """A primary and its one replica, in sync."""
    (tmp_path / "primary").mkdir()
    (tmp_path / "replica").mkdir()
    primary = RedisServer(tmp_path / "primary", ("--repl-diskless-sync-delay", "0"))
    primary.start()
    replica = RedisServer(tmp_path / "replica", ("--replicaof", "127.0.0.1", str(primary.port)))
    try:
        replica.start()
        wait_for(
            lambda: replica.client().info("replication").get("master_link_status") == "up",
            20,
            "the replica to sync",
        )
        yield primary, replica
    finally:
        replica.stop()
        primary.stop()


def _pause(server: RedisServer, sig: signal.Signals) -> None:
    assert server.proc is not None
    server.proc.send_signal(sig)


def _caught_up(primary: RedisServer, replica: RedisServer) -> None:
    """Wait for the replica, resumed, to hold everything the primary has written: its link up
    and its offset at the primary's (a retry sent the moment it was resumed found it still
    behind on a loaded machine, CI: 0 of 1 replicas within 300 ms, answered not acknowledged
    again)."""

    def level() -> bool:
        mine = replica.client().info("replication")
        wanted = int(primary.client().info("replication")["master_repl_offset"])
        done = int(mine.get("slave_repl_offset", -1)) >= wanted
        return mine.get("master_link_status") == "up" and done

    wait_for(level, 30, "the replica to catch up with its primary")


def test_a_change_is_confirmed_on_its_replica_or_not_acknowledged(
    replicated: tuple[RedisServer, RedisServer],
) -> None:
    primary, replica = replicated
    client = primary.client()
    keys = PoolKeys("nodeagent", "p")
    client.set("x", "1")
    Durability(1, 2000).confirm(client, keys.acks)  # the replica has it
    Durability(0).confirm(client, keys.acks)  # nothing asked
    _pause(replica, signal.SIGSTOP)
    try:
        client.set("x", "2")
        with pytest.raises(NotAcknowledged, match="0 of 1 replicas had it within 300 ms"):
            Durability(1, 300).confirm(client, keys.acks)
    finally:
        _pause(replica, signal.SIGCONT)
    wait_for(lambda: replica.client().get("x") == "2", 10, "the replica to catch up")
    Durability(1, 2000).confirm(client, keys.acks)


def test_a_submission_that_arrives_again_is_the_submission_it_repeats(
    redis_server: RedisServer, job_id: str
) -> None:
    """redis-py sends a script again when it lost the reply (a timeout): the job it stored is
    found by the request's id, answered as created, not refused as an id in use."""
    store = PoolStore(redis_server.client(), PoolKeys("nodeagent", f"{job_id}-pool"))
    doc = {"id": job_id, "entrypoint": ["true"], "user": "alice"}
    first = replace(load_spec(doc), request="r-1")
    created, status = store.submit(first)
    again, status_again = store.submit(first)
    assert created and again and status_again == status
    another = replace(load_spec(doc), request="r-2")  # another request for the same id
    refused, _ = store.submit(another)
    assert not refused
    assert len(store.read().jobs) == 1


def test_a_signed_request_sent_again_is_answered_as_it_was_and_done_once(
    redis_server: RedisServer, job_id: str
) -> None:
    """The same request twice in one batch (redis-py's XADD sent again), then again in a later
    batch with a new credential and the same id (a caller's retry): each answered as the first,
    one job. Without an id a copy is refused as replayed, as before."""
    store, leader, leading, signed, _ = leader_of(redis_server, f"{job_id}-pool")
    requests = RequestStore(store.client, store.keys)
    request = signed(Verb.SUBMIT, spec(f"{job_id}-a"), "rid-1")
    sent = [requests.send(request), requests.send(request)]
    leading.serve(leader)
    sent.append(requests.send(signed(Verb.SUBMIT, spec(f"{job_id}-a"), "rid-1")))
    leading.serve(leader)
    replies = [requests.reply(entry) for entry in sent]
    assert all(r is not None and r.ok for r in replies), replies
    assert len({r.message for r in replies if r is not None}) == 1
    assert set(store.read().jobs) == {f"{job_id}-a"}
    stored = store.spec(f"{job_id}-a")
    assert not isinstance(stored, str) and stored is not None and stored.request == "rid-1"


def test_a_change_not_on_its_replica_is_answered_not_acknowledged_and_its_retry_done_once(
    replicated: tuple[RedisServer, RedisServer], job_id: str
) -> None:
    """pool.durability replicas 1 with the replica stopped: the submission is stored on the
    primary but answered "not acknowledged", naming its request id; the replica back, the same
    request again (a new credential, the same id) is answered submitted: one job."""
    primary, replica = replicated
    pool = f"{job_id}-pool"
    store, leader, leading, signed, _ = leader_of(primary, pool, durability=Durability(1, 300))
    requests = RequestStore(store.client, store.keys)
    _pause(replica, signal.SIGSTOP)
    try:
        first = requests.send(signed(Verb.SUBMIT, spec(f"{job_id}-a"), "rid-1"))
        leading.serve(leader)
    finally:
        _pause(replica, signal.SIGCONT)
    said = requests.reply(first)
    assert said is not None and not said.ok and said.unacknowledged, said
    assert "not acknowledged" in said.message and "--request-id rid-1" in said.message
    _caught_up(primary, replica)  # the replica back
    again = requests.send(signed(Verb.SUBMIT, spec(f"{job_id}-a"), "rid-1"))
    leading.serve(leader)
    reply = requests.reply(again)
    assert reply is not None and reply.ok and "submitted" in reply.message, reply
    assert set(store.read().jobs) == {f"{job_id}-a"}


def test_nodeagentctl_says_not_acknowledged_with_its_request_id_and_the_same_id_submits_once(
    replicated: tuple[RedisServer, RedisServer], job_id: str
) -> None:
    """pool.auth none, the pool leader's published durability asking one replica: with the
    replica stopped `submit` exits 69 naming its request id; run again with it, the replica
    back, it exits 0, and the pool holds one job."""
    primary, replica = replicated
    pool = f"{job_id}-pool"
    keys = PoolKeys("nodeagent", pool)
    RequestStore(primary.client(), keys).publish_auth("none", Durability(1, 300))
    where = ("--redis", primary.url, "--pool", pool, "--request-id", "cli-1")
    command = (*where, "submit", "--name", job_id, "--nodes", "1", "--", "true")
    _pause(replica, signal.SIGSTOP)
    try:
        refused = nodeagentctl(*command)
    finally:
        _pause(replica, signal.SIGCONT)
    assert refused.returncode == 69, (refused.stdout, refused.stderr)
    assert "not acknowledged" in refused.stderr and "--request-id cli-1" in refused.stderr
    wait_for(lambda: replica.client().hexists(keys.specs, job_id), 10, "the replica's copy")
    _caught_up(primary, replica)
    done = nodeagentctl(*command)
    assert done.returncode == 0, (done.stdout, done.stderr)
    jobs = primary.client().hgetall(keys.jobs)
    assert list(jobs) == [job_id] and json.loads(jobs[job_id])["state"] == "pending"
