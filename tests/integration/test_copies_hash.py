"""The job's copies hash against a real redis-server (coord/handouts.py): the leader writes
each node its share, fenced by its lease, in pages; a node reads its own; garbage reads as none.
"""

from __future__ import annotations

import logging

import pytest

from nodeagent.coord import handouts
from nodeagent.coord.client import connect
from nodeagent.coord.ended import clear_job
from nodeagent.coord.keys import JobKeys
from nodeagent.coord.store import JobStore
from nodeagent.errors import FencedError
from nodeagent.model.handout import Handout, Transfer
from tests.helpers.cluster import RedisServer

LEADER = "a 7"
KEY = (30, 3, 4)


def store_for(server: RedisServer, job: str) -> JobStore:
    store = JobStore(connect(server.url, 2.0), JobKeys("nodeagent", job))
    store.client.set(store.keys.leader, LEADER)
    return store


def share(generation: int, target: str = "b") -> str:
    transfer = Transfer(KEY, 0, "0123456789abcdef", ("a",), target)
    return Handout(generation, (transfer,), ((target, "127.0.0.1:7400"),), ("d",)).to_json()


def test_the_leader_writes_shares_that_each_node_reads_and_only_the_leader_may(
    redis_server: RedisServer,
) -> None:
    store = store_for(redis_server, "copies-write")
    store.hand_out(LEADER, {"a": share(4), "b": Handout(4).to_json()}, [], reset=True)
    a = store.handout("a")
    assert a is not None and a.generation == 4 and a.transfers[0].target == "b"
    assert a.address_map == {"b": "127.0.0.1:7400"} and a.peers == ("d",)
    assert store.handout("c") is None
    store.hand_out(LEADER, {"a": share(5, "c")}, ["b"], reset=False)  # what changed only
    a = store.handout("a")
    assert a is not None and (a.generation, a.transfers[0].target) == (5, "c")
    assert store.handout("b") is None
    with pytest.raises(FencedError, match="leader lease is not b 8"):
        store.hand_out("b 8", {"a": share(9)}, [], reset=True)
    a = store.handout("a")
    assert a is not None and a.generation == 5  # nothing of the refused write landed
    store.hand_out(LEADER, {"d": share(6)}, [], reset=True)  # a new term: the rest goes
    assert store.handout("a") is None and store.handout("d") is not None
    clear_job(store.client, store.keys)
    assert not store.client.exists(store.keys.copies)


def test_many_shares_are_written_in_pages(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handouts, "PAGE", 3)
    store = store_for(redis_server, "copies-pages")
    names = [f"n{i}" for i in range(8)]
    store.hand_out(LEADER, {n: share(2) for n in names}, [], reset=True)
    assert store.client.hlen(store.keys.copies) == 8
    store.hand_out(LEADER, {}, names[:7], reset=False)
    assert store.client.hkeys(store.keys.copies) == ["n7"]


def test_garbage_in_the_copies_hash_reads_as_no_share_and_is_said_once(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    store = store_for(redis_server, "copies-garbage")
    store.client.hset(store.keys.copies, "a", '{"generation": "four"}')
    caplog.set_level(logging.WARNING, logger="nodeagent.coord.handouts")
    assert store.handout("a") is None and store.handout("a") is None
    [said] = [r.getMessage() for r in caplog.records]
    assert "garbage in Redis" in said and "'generation'" in said
    store.client.delete(store.keys.copies)
    store.client.set(store.keys.copies, "not a hash")
    assert store.handout("a") is None
    store.hand_out(LEADER, {"a": share(3)}, [], reset=False)  # the leader replaces it
    a = store.handout("a")
    assert a is not None and a.generation == 3
