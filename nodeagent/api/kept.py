"""A read the service holds fresh (api/cache.py), for a caller it knows without asking anyone,
is answered before the framework: FastAPI's routing, its dependencies and its middleware cost a
read several times what the answer does (bench/api.py: a kept read took about 0.75 ms of the
service's CPU through them, most of it in solving the route's dependencies).

Nothing is decided here that the route would decide otherwise:

- only a key a route stored is answered (Fresh.peek), so the path and query were checked by
  that route once, and every caller reads the same document (the cache's rule);
- the caller is the one `identify` names: a bearer token the pool vouched for less than a
  minute ago, or the Unix socket's peer with neither a token nor a cookie;
- one of its user's requests is spent as `identify` spends it.

Anything else (a token not seen yet or refused, a session cookie, a user past its rate, a key
not kept) goes on to the app, which answers it, errors included, as it always has.
"""

from __future__ import annotations

from typing import Any

from nodeagent.api.cache import Fresh, read_key
from nodeagent.api.connections import PEER_KEY
from nodeagent.api.identity import Tokens
from nodeagent.api.limits import RateLimiter
from nodeagent.api.problems import Problem
from nodeagent.config.hosts import Resolver

Scope = dict[str, Any]


class KeptReads:
    """An ASGI middleware: GET of a kept read by a known caller, answered from the cache."""

    def __init__(self, app: Any, reads: Fresh, tokens: Tokens, limiter: RateLimiter) -> None:
        self._app = app
        self._reads = reads
        self._tokens = tokens
        self._limiter = limiter

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "GET":
            body = self._reads.peek(read_key(scope))
            if body is not None:
                user = self._known(scope)
                if user is not None and self._limiter.take(user) == 0:
                    await send({"type": "http.response.start", "status": 200, "headers": [
                        (b"content-length", str(len(body)).encode()),
                        (b"content-type", b"application/json"),
                    ]})  # fmt: skip
                    await send({"type": "http.response.body", "body": body})
                    return
        await self._app(scope, receive, send)

    def _known(self, scope: Scope) -> str | None:
        """The caller's user as `identify` would name it without any I/O; None: let it."""
        authorization = None
        for name, value in scope["headers"]:
            if name == b"cookie":
                return None  # a browser's session: its rules are identify's
            if name == b"authorization" and authorization is None:  # the first, as Starlette
                authorization = value.decode("latin-1")
        if authorization is None:
            peer = scope.get(PEER_KEY)
            if peer is None:
                return None
            uid = int(peer[1])
            return Resolver().name_of(uid) or f"uid {uid}"
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        try:
            return self._tokens.known(token.strip())
        except Problem:
            return None  # refused a moment ago: the app says so
