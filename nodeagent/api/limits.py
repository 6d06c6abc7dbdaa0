"""What one client may take: its request rate (a token bucket per user, as GitHub's and
Slurm's rate limits count a user, not an address) and a request's body size (an ASGI
middleware that refuses a body over the limit, declared or streamed, with 413)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from nodeagent.api.problems import MEDIA_TYPE, document

Scope = dict[str, Any]
MAX_BUCKETS = 100_000  # users remembered at once; the oldest are forgotten past it


class RateLimiter:
    """A token bucket per key: `rate` a second sustained, `burst` at once."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._rate = rate
        self._burst = float(burst)
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: str) -> float:
        """0 when `key` may make a request now (one token taken), else the seconds until it
        may."""
        now = self._clock()
        with self._lock:
            tokens, at = self._buckets.pop(key, (self._burst, now))
            tokens = min(self._burst, tokens + (now - at) * self._rate)
            wait = 0.0 if tokens >= 1 else (1 - tokens) / self._rate
            self._buckets[key] = (tokens - 1 if wait == 0 else tokens, now)
            if len(self._buckets) > MAX_BUCKETS:
                del self._buckets[next(iter(self._buckets))]
        return wait


class BodyLimit:
    """An ASGI middleware: a request body over `limit` bytes is refused with 413."""

    def __init__(self, app: Any, limit: int) -> None:
        self._app = app
        self._limit = limit

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self._limit):
            await _too_large(send, self._limit, scope.get("path", ""))
            return
        seen = 0
        refused = False

        async def counted() -> Any:
            """The body as it comes; past the limit, the 413 is sent here and the app is told
            its client went away (whatever it sends after is dropped)."""
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request" and not refused:
                seen += len(message.get("body", b""))
                if seen > self._limit:
                    refused = True
                    await _too_large(send, self._limit, scope.get("path", ""))
                    return {"type": "http.disconnect"}
            return message

        async def guarded(message: Any) -> None:
            if not refused:
                await send(message)

        await self._app(scope, counted, guarded)


async def _too_large(send: Any, limit: int, path: str) -> None:
    body = json.dumps(document(413, f"the request body is over {limit} bytes", path)).encode()
    headers = [(b"content-type", MEDIA_TYPE.encode()), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})
