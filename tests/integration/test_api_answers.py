"""The API service's waiters for the pool leader's answers (api/answers.py) against a real
redis-server: the answers of one batch handed each to its own waiter, read in one round trip;
an answer that went by before its caller asked is said to have come, so the caller reads it
instead of waiting out its poll."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import cast

import pytest

from nodeagent.api.answers import Answers
from nodeagent.api.service import Identity, Service
from nodeagent.config.api import ApiSettings
from nodeagent.coord.client import connect
from nodeagent.coord.keys import PoolKeys
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.requests import RequestStore
from nodeagent.model.credential import Munge
from nodeagent.model.job import Event
from nodeagent.model.request import Reply, Verb
from tests.helpers.cluster import RedisServer


@pytest.fixture
def stores(redis_server: RedisServer) -> Iterator[tuple[PoolStore, RequestStore, Answers]]:
    store = PoolStore(connect(redis_server.url, 10.0), PoolKeys("nodeagent", "answers"))
    requests = RequestStore(store.client, store.keys)
    answers = Answers(store, requests)
    yield store, requests, answers
    answers.close()
    store.client.close()


def answer(requests: RequestStore, *request_ids: str) -> None:
    """As the pool leader answers a batch: each reply and its event in one MULTI/EXEC."""
    requests.answer(
        [
            (r, Reply(True, f"done {r}", user="alice"), Event("request_done", data={"request": r}))
            for r in request_ids
        ]
    )


class Waiter:
    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.delivered = threading.Event()

    def __call__(self, reply: Reply) -> None:
        self.replies.append(reply)
        self.delivered.set()


def following(answers: Answers, store: PoolStore, requests: RequestStore) -> None:
    """Until the answers' thread follows the stream: an answer it reads is delivered."""
    probe = Waiter()
    assert answers.expect("probe-0", probe)
    deadline = time.monotonic() + 30
    while not probe.delivered.wait(0.2):
        assert time.monotonic() < deadline, "the answers' thread never followed the stream"
        answer(requests, "probe-0")  # again: the thread may have started after the first


def test_a_batchs_answers_go_each_to_its_own_waiter(
    stores: tuple[PoolStore, RequestStore, Answers],
) -> None:
    store, requests, answers = stores
    following(answers, store, requests)
    waiters = {f"r{i}": Waiter() for i in range(5)}
    for request_id, waiter in waiters.items():
        assert answers.expect(request_id, waiter)
    answer(requests, *waiters, "someone-elses")
    for request_id, waiter in waiters.items():
        assert waiter.delivered.wait(30), request_id
        assert [r.message for r in waiter.replies] == [f"done {request_id}"]
    answers.forget("r0")


def test_an_answer_that_came_before_its_caller_asked_is_said_to_have_come(
    stores: tuple[PoolStore, RequestStore, Answers],
) -> None:
    """The leader can answer between the service's XADD and its `expect`: without the answers
    remembered, that caller would wait a whole poll (a second) for a reply already written."""
    store, requests, answers = stores
    following(answers, store, requests)
    marker = Waiter()
    assert answers.expect("after", marker)
    answer(requests, "early", "after")  # one batch: "early" is taken before "after" is handed
    assert marker.delivered.wait(30)
    assert not answers.expect("early", Waiter())  # read it now
    assert requests.reply("early") == Reply(True, "done early", user="alice")
    assert answers.expect("not-yet", Waiter())  # one not answered is waited for


def test_a_caller_gone_while_its_request_is_sent_leaves_no_waiter(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The change is cancelled (its client went away) while a worker thread sends it: the
    thread finishes the send, and no waiter is left for an answer nobody will read."""
    settings = ApiSettings(redis_url=redis_server.url, pool="answers")
    service = Service(settings, connect(redis_server.url, 10.0), cast(Munge, None))
    sending, release = threading.Event(), threading.Event()

    def send(request: object) -> str:
        sending.set()
        release.wait(30)
        return "1-1"

    monkeypatch.setattr(service, "_signed_pool", lambda: None)
    monkeypatch.setattr(service, "_credential", lambda who, digest, payload: "signed")
    monkeypatch.setattr(service.requests, "send", send)

    async def gone() -> None:
        who = Identity("alice", token="a token")
        change = asyncio.create_task(service.change(who, Verb.CANCEL, {"job": "x"}))
        while not sending.is_set():
            await asyncio.sleep(0.01)
        change.cancel()
        await asyncio.sleep(0.05)
        release.set()  # the send completes after its caller went
        with pytest.raises(asyncio.CancelledError):
            await change

    try:
        asyncio.run(gone())
        assert sending.is_set()
        assert service._answers._waiting == {}
    finally:
        service._answers.close()
        service.client.close()


def test_an_answer_written_just_after_start_reaches_a_caller_that_asks_later(
    stores: tuple[PoolStore, RequestStore, Answers],
) -> None:
    """The service starts following the stream before it sends its first request: that
    request's answer, written before its caller asks for it, is still handed over (before, the
    thread read the stream's end only at the first ask, past that answer: a one-second poll)."""
    _, requests, answers = stores
    answers.start()
    answer(requests, "first")  # answered before its caller asks
    waiter = Waiter()
    expected = answers.expect("first", waiter)
    assert not expected or waiter.delivered.wait(10), "the first answer went by unseen"
