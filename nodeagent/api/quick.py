"""A submission by a known caller, with a body that is a valid `Submit`, is handled before the
framework, as a kept read is (api/kept.py). FastAPI's routing, its dependencies, the body's
validation and the answer's were most of the service's CPU for a submission: at 500 a second
the service took 80-85 % of a core (bench/api.py), the biggest share of the machine's CPU.

Nothing is decided here that the route would decide otherwise:

- the route's own body (`routes.submitting`) submits, and the answer is the route's: 201, its
  Location, the `Submitted` document; an error is the app's problem document (problems.answer);
- the caller is the one `identify` names, found by `identity.known`: a bearer token the pool
  vouched for less than a minute ago, or the Unix socket's peer with neither token nor cookie;
- the body is read as FastAPI reads it (JSON, then the model's validation) and one of the
  user's requests is spent as `identify` spends it.

Anything else (a body that is not JSON or not a valid `Submit`, a query, a caller `identify`
must ask the pool of, a session cookie, a user past its rate) goes on to the app with the body
it sent, and is answered, errors included, as it always was.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import ValidationError

from nodeagent.api import problems
from nodeagent.api.bodies import Submit
from nodeagent.api.identity import Tokens, known
from nodeagent.api.limits import RateLimiter
from nodeagent.api.routes import location, submitting
from nodeagent.api.service import Service

Scope = dict[str, Any]
PATH = "/v1/jobs"


class QuickSubmit:
    """An ASGI middleware: POST /v1/jobs by a known caller with a valid body, submitted."""

    def __init__(self, app: Any, service: Service, tokens: Tokens, limiter: RateLimiter) -> None:
        self._app = app
        self._service = service
        self._tokens = tokens
        self._limiter = limiter

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if not _submission(scope):
            await self._app(scope, receive, send)
            return
        who = known(self._tokens, scope)
        if who is None:
            await self._app(scope, receive, send)
            return
        messages, body = await _body(receive)
        given = _given(body)
        if given is None or self._limiter.take(who.user) > 0:
            await self._app(scope, _replay(messages, receive), send)
            return
        try:
            done = await submitting(self._service, who, given)
        except Exception as exc:  # the app's handlers' answer, as the route's would be
            answer = problems.answer(exc, "POST", PATH)
        else:
            headers = {"Location": location(done.job)}
            answer = JSONResponse(done.model_dump(mode="json"), 201, headers=headers)
        await answer(scope, receive, send)


def _submission(scope: Scope) -> bool:
    if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != PATH:
        return False
    if scope.get("query_string"):
        return False
    kinds = [value for name, value in scope["headers"] if name == b"content-type"]
    return kinds == [b"application/json"]


async def _body(receive: Any) -> tuple[list[Any], bytes]:
    """The request's messages as they came (for the app, if it answers), and its body."""
    messages, parts = [], []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":  # a disconnect: the app sees it as it came
            return messages, b""
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return messages, b"".join(parts)


def _given(body: bytes) -> Submit | None:
    """The body as the route takes it, or None when the app must say what is wrong with it."""
    if not body:
        return None
    try:
        return Submit.model_validate(json.loads(body))
    except (ValueError, ValidationError):  # json's errors are ValueErrors
        return None


def _replay(messages: list[Any], receive: Any) -> Any:
    """A receive that gives the messages read already, then the connection's."""
    left = list(messages)

    async def replayed() -> Any:
        return left.pop(0) if left else await receive()

    return replayed
