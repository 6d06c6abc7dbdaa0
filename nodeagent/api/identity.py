"""Who calls the API, before anything is read or asked (docs/api.md, "Who is who").

- `Authorization: Bearer <token>`: an API token (model/token.py). The service cannot check one
  itself (it holds no key), so the first time it sees a token it asks the pool leader who that
  is (Verb.WHOAMI, signed with the token's proof); the answer is kept for a minute, or until the
  token expires. A token the pool refused is refused again for a while without asking.
- A browser's session cookie (api/session.py): the same token, taken the same way; a change
  made with it must carry the page's X-Nodeagent-CSRF from the page's origin, or it is 403.
- No token on the Unix socket: the kernel's uid of the caller (SO_PEERCRED).
- No token on a network address: 401.

Each caller then spends one token of its user's rate (api/limits.py): 429 past it.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from fastapi import Request
from fastapi.concurrency import run_in_threadpool

from nodeagent.api.connections import PEER_KEY
from nodeagent.api.limits import RateLimiter
from nodeagent.api.problems import Problem, unauthorized
from nodeagent.api.service import Identity, Service, token_user
from nodeagent.api.session import SAFE_METHODS, check_csrf, cookie_token
from nodeagent.config.hosts import Resolver
from nodeagent.model.request import REQUEST_ID, Verb
from nodeagent.pool.tokens import is_operator

KEPT_S = 60.0  # a token the pool vouched for is taken this long without asking again
REFUSED_S = 10.0  # a token the pool refused is refused this long without asking again
MAX_KEPT = 10_000


class Tokens:
    """What the pool said of the tokens this service has seen, for a while."""

    def __init__(self, service: Service, clock: Callable[[], float] = time.time) -> None:
        self._service = service
        self._clock = clock
        # digest -> until, the user (None: refused), why refused or the pool's WHOAMI answer
        self._said: dict[str, tuple[float, str | None, str]] = {}
        self._lock = threading.Lock()

    def operator(self, token: str) -> bool:
        """The pool said `token`'s user is an operator, a moment ago (what a page shows; the
        pool judges every change itself)."""
        with self._lock:
            _, user, said = self._said.get(_digest(token), (0.0, None, ""))
        return user is not None and is_operator(said)

    def forget(self, token: str) -> None:
        """`token` was revoked here (a sign-out): it is asked of the pool again next time."""
        with self._lock:
            self._said.pop(_digest(token), None)

    def remember(self, token: str, user: str, said: str) -> None:
        """What the pool has just said of `token` another way (a sign-in)."""
        self._keep(token, (self._clock() + KEPT_S, user, said))

    def known(self, token: str) -> str | None:
        """The user the pool said `token` is, if it said so less than a minute ago (no I/O);
        None: ask (`user`).

        Raises:
            Problem: 401, the pool refused it a moment ago.
        """
        with self._lock:
            until, user, why = self._said.get(_digest(token), (0.0, None, ""))
        if self._clock() >= until:
            return None
        if user is None:
            raise unauthorized(why)
        return user

    def user(self, token: str, before_asking: Callable[[], None] = lambda: None) -> str:
        """The user the pool says `token` is; `before_asking` runs before the pool is asked
        (what charges an unproven caller's rate).

        Raises:
            Problem: 401 (not a token, expired, of another pool, refused by the pool), or as
                Service.ask.
        """
        now = self._clock()
        named = token_user(token, self._service.pool, now)
        known = self.known(token)
        if known is not None:
            return known
        before_asking()
        reply = self._service.ask(Identity(named, token=token), Verb.WHOAMI, {})
        if reply.ok:
            self._keep(token, (now + KEPT_S, reply.user, reply.message))
            return reply.user
        self._keep(token, (now + REFUSED_S, None, reply.message))
        raise unauthorized(reply.message)

    def _keep(self, token: str, said: tuple[float, str | None, str]) -> None:
        with self._lock:
            if len(self._said) >= MAX_KEPT:
                self._said.clear()
            self._said[_digest(token)] = said


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def bearer(header: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (None: not one)."""
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _bearer(header: str) -> str:
    token = bearer(header)
    if token is None:
        raise unauthorized("expected Authorization: Bearer <token> (nodeagentctl token)")
    return token


def peer_user(uid: int) -> str:
    """The user a socket's peer of `uid` acts as."""
    return Resolver().name_of(uid) or f"uid {uid}"


def known(tokens: Tokens, scope: Mapping[str, Any]) -> Identity | None:
    """The caller as `identify` names it, when that takes no I/O (api/kept.py, api/quick.py):
    a bearer token the pool vouched for a moment ago (the first Authorization header, as
    Starlette's), or the socket's peer with neither token nor cookie; None: leave it to
    `identify`."""
    header = None
    for name, value in scope["headers"]:
        if name == b"cookie":
            return None  # a browser's session: its rules are identify's
        if name == b"authorization" and header is None:
            header = value.decode("latin-1")
    key = _key(scope)
    if key is None:
        return None  # not an id: identify says so
    if header is None:
        peer = scope.get(PEER_KEY)
        if peer is None:
            return None
        uid = int(peer[1])
        return Identity(peer_user(uid), peer_uid=uid, request_id=key)
    token = bearer(header)
    if token is None:
        return None
    try:
        user = tokens.known(token)
    except Problem:
        return None  # refused a moment ago: identify says so
    return Identity(user, token=token, request_id=key) if user is not None else None


def _key(scope: Mapping[str, Any]) -> str | None:
    """The request's Idempotency-Key (IETF draft: the same for every try of one change); ""
    for none, None for one that is not a request id."""
    for name, value in scope["headers"]:
        if name == b"idempotency-key":
            key = value.decode("latin-1")
            return key if key and REQUEST_ID.match(key) else None
    return ""


def idempotency_key(value: str) -> str:
    """Raises: Problem 400 unless it is a request id (model/request.py REQUEST_ID)."""
    if not value or not REQUEST_ID.match(value):
        raise Problem(
            400,
            f"Idempotency-Key: expected up to 128 letters, digits and . _ : - (a UUID does), "
            f"got {value[:80]!r}",
        )
    return value


async def identify(request: Request) -> Identity:
    """FastAPI's dependency: the caller, or 401; 429 past its user's rate. On the event loop
    for a token the pool vouched for a moment ago or a socket's peer; asking the pool of a new
    token waits in a worker thread."""
    tokens: Tokens = request.app.state.tokens
    limiter: RateLimiter = request.app.state.limiter
    header = request.headers.get("authorization")
    peer = request.scope.get(PEER_KEY)
    session = cookie_token(request.cookies, peer is not None) if header is None else None
    if header is not None or session is not None:
        where = request.client.host if request.client else "the socket"
        token = _bearer(header) if header is not None else str(session)
        if header is None and request.method not in SAFE_METHODS:
            check_csrf(request, token)
        user = tokens.known(token)
        if user is None:  # a token not seen yet costs the pool a request: its address pays
            charge = lambda: limited(limiter, f"unproven callers from {where}")  # noqa: E731
            user = await run_in_threadpool(tokens.user, token, charge)
        who = Identity(user, token=token)
    elif peer is not None:
        uid = int(peer[1])
        who = Identity(peer_user(uid), peer_uid=uid)
    else:
        raise unauthorized("this address takes API tokens: Authorization: Bearer <token>")
    limited(limiter, who.user)
    key = request.headers.get("idempotency-key")
    return replace(who, request_id=idempotency_key(key)) if key is not None else who


def limited(limiter: RateLimiter, key: str) -> None:
    """Spend one of `key`'s requests. Raises: Problem 429 past its rate."""
    wait = limiter.take(key)
    if wait > 0:
        raise Problem(
            429, f"{key}: too many requests; try again in {wait:.1f} s",
            {"Retry-After": str(max(1, round(wait)))},
        )  # fmt: skip
