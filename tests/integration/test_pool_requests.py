"""The pool leader's side of the requests stream (pool/requests.py) against a real
redis-server, in process: token-signed requests appended to the stream, then taken in one batch
as the leader takes them. What a batch reads once (a token's registration) must not outlive a
revocation in the same batch; the leader's wait for the next request of a burst wakes when one
comes."""

from __future__ import annotations

import os
import pwd
import threading
import time

import pytest

from nodeagent.coord.pool import PoolStore
from nodeagent.coord.requests import RequestStore
from nodeagent.model.request import Reply, Verb
from nodeagent.model.spec import JobSpec
from tests.helpers.cluster import RedisServer
from tests.helpers.poolrequests import leader_of, spec


def test_a_token_revoked_in_a_batch_is_refused_for_the_requests_after_it(
    redis_server: RedisServer, job_id: str
) -> None:
    store, leader, leading, signed, token_id = leader_of(redis_server, f"{job_id}-pool")
    requests = RequestStore(store.client, store.keys)
    sent = [
        requests.send(signed(Verb.SUBMIT, spec(f"{job_id}-before"))),
        requests.send(signed(Verb.TOKEN, {"action": "revoke", "id": token_id})),
        requests.send(signed(Verb.SUBMIT, spec(f"{job_id}-after"))),
    ]
    taken = leading.serve(leader)
    assert len(taken) == 3  # one batch
    replies = [requests.reply(request_id) for request_id in sent]
    assert all(isinstance(reply, Reply) for reply in replies)
    before, revoked, after = (reply for reply in replies if reply is not None)
    assert before.ok and revoked.ok, (before, revoked)
    assert not after.ok and f"token {token_id} revoked" in after.message
    assert store.status(f"{job_id}-before") is not None
    assert store.status(f"{job_id}-after") is None


def test_the_leader_s_wait_for_the_next_request_wakes_when_one_comes(
    redis_server: RedisServer, job_id: str
) -> None:
    store, leader, leading, signed, _ = leader_of(redis_server, f"{job_id}-pool")
    requests = RequestStore(store.client, store.keys)
    assert not leading.more(0.01)  # nothing taken yet: nothing to wait after
    requests.send(signed(Verb.SUBMIT, spec(f"{job_id}-1")))
    assert len(leading.serve(leader)) == 1
    assert not leading.more(0.05)  # none came

    later = threading.Timer(0.3, lambda: requests.send(signed(Verb.SUBMIT, spec(f"{job_id}-2"))))
    later.start()
    began = time.monotonic()
    assert leading.more(30.0)  # woken by the append, not by the 30 s
    assert time.monotonic() - began < 25.0
    later.join()
    assert leading.more(0.001)  # one waits: at once
    assert [reply.ok for reply in leading.serve(leader)] == [True]


def test_a_submission_sent_twice_is_stored_once_and_a_refused_one_is_taken_too(
    redis_server: RedisServer, job_id: str
) -> None:
    """A token's proof is no MUNGE credential (munged's replay check does not see it): the
    pool's memory of the credentials it took refuses the copy, in the script that would store
    its job (POOL_TAKE_SUBMIT). A submission refused before it is stored is taken then, so its
    copy is refused as replayed too; every request is taken (the cursor past the last)."""
    store, leader, leading, signed, _ = leader_of(redis_server, f"{job_id}-pool")
    requests = RequestStore(store.client, store.keys)
    good = signed(Verb.SUBMIT, spec(f"{job_id}-once"))
    bad = signed(Verb.SUBMIT, {"spec": {"id": f"{job_id}-bad", "entrypoint": []}})
    sent = [requests.send(request) for request in (good, good, bad, bad)]
    leading.serve(leader)
    replies = [requests.reply(request_id) for request_id in sent]
    said = [(r.ok, r.message) if r is not None else None for r in replies]
    assert said[0] is not None and said[0][0], said
    replayed = (False, "refused: credential replayed: it was used before")
    assert said[1] == replayed and said[3] == replayed, said
    assert said[2] is not None and "invalid job spec" in said[2][1], said
    assert set(store.read().jobs) == {f"{job_id}-once"}
    assert store.client.get(store.keys.request_cursor) == sent[-1]


def test_a_batch_s_submissions_sent_together_keep_the_stream_s_order(
    redis_server: RedisServer, job_id: str
) -> None:
    """The scripts of a batch's submissions go to Redis together (pool/requests.Pending); what
    else the batch asks sees every submission before it done: a cancel of a job submitted just
    before, a dependency on one, a second submission of an id, a copy of a credential."""
    store, leader, leading, signed, _ = leader_of(redis_server, f"{job_id}-pool")
    requests = RequestStore(store.client, store.keys)
    first = signed(Verb.SUBMIT, spec(f"{job_id}-a"))
    after_a = {"dependency": f"afterany:{job_id}-a"}
    batch = [
        first,
        signed(Verb.SUBMIT, spec(f"{job_id}-b")),
        signed(Verb.CANCEL, {"job": f"{job_id}-a"}),
        signed(Verb.SUBMIT, {"spec": {**spec(f"{job_id}-c")["spec"], **after_a}}),
        signed(Verb.SUBMIT, spec(f"{job_id}-b")),
        first,
        signed(Verb.SUBMIT, spec(f"{job_id}-d")),
    ]
    sent = [requests.send(request) for request in batch]
    assert len(leading.serve(leader)) == len(batch)  # one batch
    replies = [requests.reply(request_id) for request_id in sent]
    said = [(reply.ok, reply.message) for reply in replies if reply is not None]
    assert len(said) == len(batch)
    assert [ok for ok, _ in said] == [True, True, True, True, False, False, True], said
    assert said[2][1].startswith(f"job {job_id}-a: cancel requested")
    assert said[4][1].startswith(f"refused: job {job_id}-b "), said[4]
    assert said[5][1] == "refused: credential replayed: it was used before"
    assert store.spec(f"{job_id}-c") is not None and store.status(f"{job_id}-d") is not None
    me = pwd.getpwuid(os.getuid()).pw_name
    assert store.read(nodes=False).cancels == {f"{job_id}-a": me}  # the job it cancelled
    cursor = store.client.get(store.keys.request_cursor)
    assert cursor == sent[-1]  # every request taken, the last one last


def test_a_batch_reads_its_submissions_queues_and_arrays_once_and_sees_its_own_changes(
    redis_server: RedisServer, job_id: str
) -> None:
    """The arrays and queues a batch's submissions name are read once for the batch (Known);
    a queue made and an array stored by a request of the same batch are seen by the
    submissions after it, as they were when each submission read them on its own."""
    store, leader, leading, signed, _ = leader_of(redis_server, f"{job_id}-pool")
    requests = RequestStore(store.client, store.keys)
    queued = {"spec": {**spec(f"{job_id}-q1")["spec"], "queue": "fresh"}}
    again = {"spec": {**spec(f"{job_id}-q2")["spec"], "queue": "fresh"}}
    array = {"spec": {**spec(f"{job_id}-arr")["spec"], "array": "0-1"}}
    sent = [
        requests.send(signed(Verb.SUBMIT, queued)),  # no such queue yet
        requests.send(signed(Verb.QUEUE, {"action": "create", "name": "fresh"})),
        requests.send(signed(Verb.SUBMIT, again)),  # the queue made just before
        requests.send(signed(Verb.SUBMIT, array)),
        requests.send(signed(Verb.SUBMIT, spec(f"{job_id}-arr"))),  # the array's live id
        requests.send(signed(Verb.SUBMIT, spec(f"{job_id}-plain"))),
    ]
    assert len(leading.serve(leader)) == len(sent)  # one batch
    replies = [requests.reply(request_id) for request_id in sent]
    said = [(r.ok, r.message) if r is not None else None for r in replies]
    assert said[0] is not None and not said[0][0], said
    assert "queue fresh does not exist" in said[0][1]
    assert [s[0] if s is not None else None for s in said[1:4]] == [True, True, True], said
    assert said[4] is not None and not said[4][0], said
    assert f"{job_id}-arr is an array of 2 tasks not ended" in said[4][1]
    assert said[5] is not None and said[5][0], said
    jobs = set(store.read().jobs)
    assert {f"{job_id}-q2", f"{job_id}-arr_0", f"{job_id}-arr_1", f"{job_id}-plain"} <= jobs
    assert f"{job_id}-q1" not in jobs and f"{job_id}-arr" not in jobs


def test_the_specs_a_batch_stores_are_handed_to_the_rounds_as_a_reader_decodes_them(
    redis_server: RedisServer, job_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader's rounds take the specs its requests' thread stored (PoolStore.made), not
    decoding them again: each is the spec a fresh reader decodes from the stored text."""
    store, leader, leading, signed, _ = leader_of(redis_server, f"{job_id}-pool")
    requests = RequestStore(store.client, store.keys)
    plain = spec(f"{job_id}-plain")
    rich = {
        "spec": {
            **spec(f"{job_id}-rich")["spec"],
            "env": {"A": "1"},
            "priority": 3,
            "timing": {"stop_grace_period": 20},
            "dependency": f"afterok:{job_id}-plain",
            "selector": {"gpu": "h100"},
        }
    }
    for doc in (plain, rich):
        requests.send(signed(Verb.SUBMIT, doc))
    replies = leading.serve(leader)
    assert [reply.ok for reply in replies] == [True, True], replies
    ids = [f"{job_id}-plain", f"{job_id}-rich"]
    decoded: list[str] = []
    decode = JobSpec.from_json

    def counted(raw: str | bytes) -> JobSpec:
        decoded.append(str(raw))
        return decode(raw)

    monkeypatch.setattr(JobSpec, "from_json", staticmethod(counted))
    held = store.specs(ids)
    assert decoded == []  # the leader's store took them as they were made
    fresh = PoolStore(store.client, store.keys).specs(ids)
    assert len(decoded) == 2  # a fresh reader decodes both
    assert held == fresh, (held, fresh)
    assert held[f"{job_id}-rich"].dependency_runs == {f"{job_id}-plain": 1}  # type: ignore[union-attr]
