"""nodeagentctl's wait for the pool leader's answer (cli/ctl/signing.wait_reply) against a real
redis-server: woken by the answer's event in the pool's stream (others' answers followed past),
the reply read at least every second without it (an event trimmed away, a stream that is not
one, or a stream nodeagentctl could not read before it sent), None when no answer comes in
time."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from nodeagent.cli.ctl import signing
from nodeagent.coord.client import connect
from nodeagent.coord.keys import PoolKeys
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.requests import RequestStore
from nodeagent.model.job import Event
from nodeagent.model.request import Reply
from tests.helpers.cluster import RedisServer

pytestmark = pytest.mark.timeout(60)


def pool(redis_server: RedisServer, name: str) -> tuple[PoolStore, RequestStore]:
    store = PoolStore(connect(redis_server.url, 10.0), PoolKeys("nodeagent", name))
    return store, RequestStore(store.client, store.keys)


def answered(requests: RequestStore, request_id: str, ok: bool = True) -> Reply:
    reply = Reply(ok, f"answer to {request_id}", "alice")
    event = Event("request_done", message="alice: done", data={"request": request_id})
    requests.answer([(request_id, reply, event)])
    return reply


def later(seconds: float, act: Callable[[], object]) -> threading.Timer:
    timer = threading.Timer(seconds, act)
    timer.start()
    return timer


def test_the_answer_s_event_wakes_the_wait_past_other_answers(
    redis_server: RedisServer, job_id: str
) -> None:
    store, requests = pool(redis_server, f"{job_id}-pool")
    after = store.last_event_id()
    others = later(0.1, lambda: answered(requests, "1-1"))
    mine = later(0.3, lambda: answered(requests, "2-2"))
    reply = signing.wait_reply(store, requests, "2-2", after, 20.0)
    others.join()
    mine.join()
    assert reply == Reply(True, "answer to 2-2", "alice")


def test_a_reply_without_its_event_is_read_by_the_poll(
    redis_server: RedisServer, job_id: str
) -> None:
    store, requests = pool(redis_server, f"{job_id}-pool")
    after = store.last_event_id()
    reply = Reply(False, "refused: no", "bob", kind="forbidden")
    writer = later(0.2, lambda: store.client.set(store.keys.reply("3-3"), reply.to_json()))
    assert signing.wait_reply(store, requests, "3-3", after, 20.0) == reply
    writer.join()


def test_garbage_in_the_stream_leaves_the_poll_and_no_answer_is_none(
    redis_server: RedisServer, job_id: str
) -> None:
    store, requests = pool(redis_server, f"{job_id}-pool")
    store.client.set(store.keys.events, "not a stream")  # XREAD: WRONGTYPE
    writer = later(0.2, lambda: answered_reply_only(store, "4-4"))
    assert signing.wait_reply(store, requests, "4-4", "0-0", 20.0) == Reply(True, "late", "c")
    writer.join()
    assert signing.wait_reply(store, requests, "4-4", None, 20.0) == Reply(True, "late", "c")
    assert signing.wait_reply(store, requests, "5-5", "0-0", 1.5) is None


def answered_reply_only(store: PoolStore, request_id: str) -> None:
    store.client.set(store.keys.reply(request_id), Reply(True, "late", "c").to_json())
