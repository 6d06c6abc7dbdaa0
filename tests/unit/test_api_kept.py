"""A kept read answered before the framework (api/kept.py): only to a caller the route would
name without asking anyone, only what a route kept, one of the user's requests spent; anything
else goes on to the app."""

from __future__ import annotations

import asyncio
import os
import pwd
from typing import Any, cast

from nodeagent.api.cache import Fresh, read_key
from nodeagent.api.connections import PEER_KEY
from nodeagent.api.identity import Tokens
from nodeagent.api.kept import KeptReads
from nodeagent.api.limits import RateLimiter
from nodeagent.api.service import Service

TOKEN = "alice-token"
DOCUMENT = b'{"version": 1, "nodes": []}'


class App:
    """The app behind: it records what reached it."""

    def __init__(self) -> None:
        self.reached: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.reached.append(read_key(scope))
        await send({"type": "http.response.start", "status": 418, "headers": []})
        await send({"type": "http.response.body", "body": b"the app"})


def scope(
    path: str = "/v1/nodes", query: bytes = b"", method: str = "GET", **headers: str
) -> dict[str, Any]:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        PEER_KEY: None,
    }


def call(app: KeptReads, request: dict[str, Any]) -> tuple[int, bytes, dict[bytes, bytes]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(request, receive, send))
    return sent[0]["status"], sent[1]["body"], dict(sent[0]["headers"])


def parts(rate: float = 1000.0, burst: int = 1000) -> tuple[KeptReads, App, Fresh, RateLimiter]:
    inner, reads = App(), Fresh(60.0)
    tokens = Tokens(cast(Service, None))  # never asked here: only what it was told
    tokens.remember(TOKEN, "alice", "alice")
    limiter = RateLimiter(rate, burst)
    reads.get(read_key(scope()), lambda: DOCUMENT)  # as the route keeps it
    return KeptReads(inner, reads, tokens, limiter), inner, reads, limiter


def test_a_kept_read_for_a_token_the_pool_vouched_for_is_answered_from_the_cache() -> None:
    kept, inner, _, limiter = parts(rate=0.001, burst=2)
    status, body, headers = call(kept, scope(authorization=f"Bearer {TOKEN}"))
    assert (status, body, inner.reached) == (200, DOCUMENT, [])
    assert headers == {b"content-length": b"27", b"content-type": b"application/json"}
    assert limiter.take("alice") == 0 and limiter.take("alice") > 0  # the read spent one of 2


def test_on_the_socket_the_peer_is_the_caller() -> None:
    kept, inner, _, _ = parts()
    me = scope()
    me[PEER_KEY] = (os.getpid(), os.getuid(), os.getgid())
    assert call(kept, me)[:2] == (200, DOCUMENT) and inner.reached == []


def test_a_user_past_their_rate_goes_to_the_app_which_says_429() -> None:
    kept, inner, _, limiter = parts(rate=0.001, burst=1)
    me = pwd.getpwuid(os.getuid()).pw_name
    limiter.take(me)
    socket_caller = scope()
    socket_caller[PEER_KEY] = (os.getpid(), os.getuid(), os.getgid())
    assert call(kept, socket_caller)[0] == 418 and inner.reached == ["/v1/nodes?"]


def test_whatever_the_route_would_judge_goes_on_to_the_app() -> None:
    kept, inner, _, _ = parts()
    cases = {
        "a token not seen yet": scope(authorization="Bearer bob-token"),
        "not a bearer token": scope(authorization=f"Basic {TOKEN}"),
        "a browser's session": scope(authorization=f"Bearer {TOKEN}", cookie="session=x"),
        "no token on a network address": scope(),
        "a read not kept": scope(query=b"state=running", authorization=f"Bearer {TOKEN}"),
        "a change": scope(method="POST", authorization=f"Bearer {TOKEN}"),
    }
    for what, request in cases.items():
        assert call(kept, request)[0] == 418, what
    assert len(inner.reached) == len(cases)


def test_of_two_authorization_headers_the_first_counts_as_in_the_route() -> None:
    kept, inner, _, _ = parts()
    twice = scope()
    twice["headers"] = [
        (b"authorization", b"Bearer unseen"),
        (b"authorization", b"Bearer " + TOKEN.encode()),
    ]
    assert call(kept, twice)[0] == 418 and inner.reached == ["/v1/nodes?"]


def test_a_name_with_an_encoded_question_mark_is_not_the_query_s() -> None:
    encoded = scope("/v1/jobs/a?b")
    encoded["raw_path"] = b"/v1/jobs/a%3Fb"
    assert read_key(encoded) == "/v1/jobs/a%3Fb?"
    assert read_key(scope("/v1/jobs/a", query=b"b")) == "/v1/jobs/a?b"
