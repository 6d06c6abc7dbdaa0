"""A read the service holds fresh (api/cache.py), for a caller it knows without asking anyone,
is answered before the framework: FastAPI's routing, its dependencies and its middleware cost a
read several times what the answer does (bench/api.py: a kept read took about 0.75 ms of the
service's CPU through them, most of it in solving the route's dependencies).

Nothing is decided here that the route would decide otherwise:

- only a key a route stored is answered (Fresh.peek), so the path and query were checked by
  that route once, and every caller reads the same document (the cache's rule);
- the caller is the one `identify` names, found by `identity.known` beside it: a bearer token
  the pool vouched for less than a minute ago, or the Unix socket's peer with neither a token
  nor a cookie;
- one of its user's requests is spent as `identify` spends it.

Anything else (a token not seen yet or refused, a session cookie, a user past its rate, a key
not kept) goes on to the app, which answers it, errors included, as it always has.
"""

from __future__ import annotations

from typing import Any

from nodeagent.api.cache import Fresh, read_key
from nodeagent.api.identity import Tokens, known
from nodeagent.api.limits import RateLimiter

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
                who = known(self._tokens, scope)
                if who is not None and self._limiter.take(who.user) == 0:
                    await send({"type": "http.response.start", "status": 200, "headers": [
                        (b"content-length", str(len(body)).encode()),
                        (b"content-type", b"application/json"),
                    ]})  # fmt: skip
                    await send({"type": "http.response.body", "body": body})
                    return
        await self._app(scope, receive, send)
