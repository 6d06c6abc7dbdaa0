"""A known caller's submission handled before the framework (api/quick.py): it gets what the
route gives it (the same status, headers and document, an error's problem document included),
and anything the route must judge itself reaches the app, with the body it sent.

Each request is sent twice, to the quick path in front of the real app (make_app) and to the
app alone, and the two answers compared. The pool behind is a stand-in for Service.change: its
answers and refusals are what the real pool's are (Reply, api/problems.refused)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import pytest

from nodeagent.api import routes
from nodeagent.api.app import make_app
from nodeagent.api.connections import PEER_KEY
from nodeagent.api.identity import Tokens
from nodeagent.api.problems import refused
from nodeagent.api.quick import QuickSubmit
from nodeagent.api.service import Identity, Service
from nodeagent.config.api import load_api
from nodeagent.errors import CoordinationError
from nodeagent.model.request import Reply, Verb

TOKEN = "alice-token"
SPEC = {"id": "train-1", "entrypoint": ["python", "train.py"], "min_nodes": 2}


@pytest.fixture(autouse=True)
def made_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """The id a spec without one gets: the same for both answers compared."""
    monkeypatch.setattr(routes, "new_job_id", lambda: "job-made")


class Pool:
    """Service's settings and `change`, the pool leader's answers: what each change asked."""

    def __init__(self, rate: float = 1000.0, burst: int = 1000) -> None:
        limits = {"requests_per_second": rate, "burst": burst}
        self.settings = load_api(
            {"redis": {"url": "redis://127.0.0.1:1"}, "pool": "p", "limits": limits}
        )
        self.asked: list[tuple[Identity, Verb, dict[str, Any]]] = []
        self.answer: Reply | Exception = Reply(True, "submitted train-1", "alice")

    async def change(self, who: Identity, verb: Verb, args: dict[str, Any]) -> Reply:
        self.asked.append((who, verb, args))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


class Spy:
    """The app behind the quick path: it records each request that reached it."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.reached = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.reached += 1
        await self.app(scope, receive, send)


def parts(pool: Pool) -> tuple[QuickSubmit, Spy, Any]:
    app = make_app(cast(Service, pool))
    tokens: Tokens = app.state.tokens
    tokens.remember(TOKEN, "alice", "alice")  # the pool vouched for it a moment ago
    spy = Spy(app)
    return QuickSubmit(spy, cast(Service, pool), tokens, app.state.limiter), spy, app


def request(
    body: bytes, query: bytes = b"", peer: tuple[int, int, int] | None = None, **headers: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The scope of POST /v1/jobs, and its body in two messages (as a client's may come)."""
    headers.setdefault("content_type", "application/json")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/jobs",
        "raw_path": b"/v1/jobs",
        "root_path": "",
        "query_string": query,
        "headers": [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        PEER_KEY: peer,
    }
    half = len(body) // 2
    messages = [
        {"type": "http.request", "body": body[:half], "more_body": True},
        {"type": "http.request", "body": body[half:], "more_body": False},
    ]
    return scope, messages


def answer(
    app: Any, scope: dict[str, Any], messages: list[dict[str, Any]]
) -> tuple[int, dict[bytes, bytes], Any]:
    sent: list[dict[str, Any]] = []
    left = list(messages)

    async def receive() -> dict[str, Any]:
        if left:
            return left.pop(0)
        await asyncio.sleep(3600)  # the client stays: no disconnect while it is answered
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return sent[0]["status"], dict(sent[0]["headers"]), json.loads(body)


def both(
    pool: Pool, body: bytes, query: bytes = b"", peer: Any = None, **headers: str
) -> tuple[tuple[int, dict[bytes, bytes], Any], int]:
    """The quick path's answer, once it is checked to equal the app's alone; and how many of
    the quick path's requests reached the app."""
    quick, spy, _ = parts(pool)
    scope, messages = request(body, query, peer, **headers)
    got = answer(quick, scope, messages)
    _, _, alone = parts(pool)
    assert got == answer(alone, *request(body, query, peer, **headers))
    return got, spy.reached


def test_a_known_tokens_submission_is_the_routes_answer_without_the_app() -> None:
    pool = Pool()
    body = json.dumps({"spec": SPEC, "hold": True}).encode()
    (status, headers, document), reached = both(pool, body, authorization=f"Bearer {TOKEN}")
    assert (status, reached) == (201, 0)
    assert headers[b"location"] == b"/v1/jobs/train-1"
    assert headers[b"content-type"] == b"application/json"
    assert document == {"message": "submitted train-1", "user": "alice", "job": "train-1"}
    who, verb, args = pool.asked[0]
    assert (who, verb) == (Identity("alice", token=TOKEN), Verb.SUBMIT)
    assert args == {"spec": SPEC, "hold": True}
    assert pool.asked[0] == pool.asked[1]  # the app asked the same


def test_on_the_socket_the_peer_submits_as_itself() -> None:
    pool = Pool()
    body = json.dumps({"spec": {**SPEC, "id": ""}}).encode()
    (status, _, document), reached = both(pool, body, peer=(4242, 0, 0))
    assert (status, reached) == (201, 0)
    who, _, args = pool.asked[0]
    assert who.peer_uid == 0 and who.token is None
    assert args["spec"]["id"] == document["job"] == "job-made"  # made as the route makes one


@pytest.mark.parametrize(
    ("refusal", "status"),
    [
        (Reply(False, "refused: min_nodes: expected an integer", kind="invalid"), 422),
        (Reply(False, "refused: train-1 is another user's job", kind="forbidden"), 403),
        (Reply(False, "refused: train-1 is running"), 409),
    ],
)
def test_a_pools_refusal_is_the_apps_problem_document(refusal: Reply, status: int) -> None:
    pool = Pool()
    pool.answer = refused(refusal)
    body = json.dumps({"spec": SPEC}).encode()
    (got, headers, document), reached = both(pool, body, authorization=f"Bearer {TOKEN}")
    assert (got, reached) == (status, 0)
    assert headers[b"content-type"] == b"application/problem+json"
    assert document["detail"] == refusal.message and document["instance"] == "/v1/jobs"


def test_a_redis_outage_is_the_apps_503() -> None:
    pool = Pool()
    pool.answer = CoordinationError("Connection refused")
    (status, headers, document), reached = both(
        pool, json.dumps({"spec": SPEC}).encode(), authorization=f"Bearer {TOKEN}"
    )
    assert (status, reached, headers[b"retry-after"]) == (503, 0, b"5")
    assert "Redis cannot be reached" in document["detail"]


@pytest.mark.parametrize(
    ("body", "query", "headers"),
    [
        (b'{"spec": {"id": "x"', b"", {}),  # not JSON
        (b'{"spec": {}, "priority": 5}', b"", {}),  # a field Submit does not have
        (b'{"spec": "train.py"}', b"", {}),  # not an object
        (b"", b"", {}),  # no body
        (b'{"spec": {}}', b"hold=1", {}),  # a query
        (b'{"spec": {}}', b"", {"content_type": "text/plain"}),
        (b'{"spec": {}}', b"", {"cookie": "nodeagent_session=x"}),
    ],
)
def test_what_the_route_must_judge_reaches_the_app_with_its_body(
    body: bytes, query: bytes, headers: dict[str, str]
) -> None:
    pool = Pool()
    headers = {"authorization": f"Bearer {TOKEN}", **headers}
    (status, _, _), reached = both(pool, body, query, **headers)
    assert reached == 1
    assert status in (201, 422, 403, 401)  # the app's own answer, equal to the app alone's


def test_a_token_not_vouched_for_reaches_the_app() -> None:
    pool = Pool()
    quick, spy, _ = parts(pool)
    with pytest.raises(AttributeError):  # identify asks the pool of it: the stand-in has no ask
        answer(quick, *request(b'{"spec": {}}', authorization="Bearer unseen"))
    assert spy.reached == 1 and pool.asked == []


def test_a_user_past_its_rate_gets_the_apps_429_and_spends_one_request() -> None:
    pool = Pool(rate=0.001, burst=1)
    quick, spy, _ = parts(pool)
    body = json.dumps({"spec": SPEC}).encode()
    first = answer(quick, *request(body, authorization=f"Bearer {TOKEN}"))
    second = answer(quick, *request(body, authorization=f"Bearer {TOKEN}"))
    assert (first[0], second[0], spy.reached, len(pool.asked)) == (201, 429, 1, 1)
    assert second[1][b"retry-after"]
