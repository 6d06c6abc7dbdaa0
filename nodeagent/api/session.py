"""A browser's session (docs/ui.md, "Signing in"): `nodeagentctl ui` prints a link whose
fragment carries a one-time code; the sign-in page posts it here.

- The link carries a code, not a token: the pool leader minted the session's token for
  `nodeagentctl ui` and keeps it for whoever brings the code first, for ten minutes (TOKEN
  signin, pool/tokens.py). The service redeems it as itself and gets the token sealed for its
  own uid; so a link found later in a history or a terminal's scroll-back is worth nothing.
- The session is the token itself, in an HttpOnly, SameSite=Strict cookie that lives as long as
  the token (`__Host-` and Secure on HTTPS): the page's scripts never hold it, and another
  site's requests never carry it.
- A change made with the cookie must also carry `X-Nodeagent-CSRF`, a value derived from the
  token that only the page can read (GET /v1/session, same-origin), and an `Origin` of this
  host when the browser sends one: a forged cross-site POST is refused (api/identity.py).
- Signing out revokes the token in the pool, not only the cookie.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping

from fastapi import Request, Response

from nodeagent.api import bodies
from nodeagent.api.problems import Problem, unauthorized
from nodeagent.api.service import Identity, Service
from nodeagent.model.request import Verb
from nodeagent.model.token import TokenError, parse_token
from nodeagent.pool.tokens import is_operator
from nodeagent.views.documents import rfc3339

SECURE_COOKIE = "__Host-nodeagent-session"  # HTTPS: Secure, Path=/, no Domain (the prefix's rules)
PLAIN_COOKIE = "nodeagent-session"  # the Unix socket (no browser reaches it; a local client may)
CSRF_HEADER = "x-nodeagent-csrf"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def csrf_of(token: str) -> str:
    """The value a session's changes carry: of the token, but telling nothing of it."""
    return hashlib.sha256(b"nodeagent-csrf-v1\0" + token.encode()).hexdigest()


def cookie_token(cookies: Mapping[str, str], on_socket: bool) -> str | None:
    """The session's token: on HTTPS only from the `__Host-` cookie (a plain one could be
    planted by any server of the same host name, whatever its port)."""
    if on_socket:
        return cookies.get(SECURE_COOKIE) or cookies.get(PLAIN_COOKIE)
    return cookies.get(SECURE_COOKIE)


def same_origin(request: Request) -> None:
    """Raises: Problem 403 when the browser says the request comes from another origin."""
    origin = request.headers.get("origin")
    host = request.headers.get("host", "")
    if origin is not None and origin.partition("://")[2] != host:
        raise Problem(403, f"a request from {origin[:100]} is refused: not this host's page")
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        raise Problem(403, "a cross-site request is refused: not this host's page")


def check_csrf(request: Request, token: str) -> None:
    """A change made with the session cookie: the page's header, from the page's origin.

    Raises:
        Problem: 403, a forged request.
    """
    same_origin(request)
    if request.headers.get(CSRF_HEADER) != csrf_of(token):
        raise Problem(
            403,
            "a change made with the session cookie must carry X-Nodeagent-CSRF "
            "(the UI's own requests do): refused as a cross-site request",
        )


def token_id(token: str) -> str:
    try:
        return parse_token(token)[0].id
    except TokenError as exc:
        raise unauthorized(str(exc)) from None


def document(token: str, user: str, operator: bool, with_csrf: bool) -> bodies.Session:
    try:
        claims, _ = parse_token(token)
    except TokenError as exc:  # checked before; said anyway
        raise unauthorized(str(exc)) from None
    return bodies.Session(
        user=user,
        operator=operator,
        expires=rfc3339(claims.expires_s * 1000) or "",
        csrf=csrf_of(token) if with_csrf else None,
    )


def sign_in(
    service: Service,
    request: Request,
    response: Response,
    code: str,
    remember: Callable[[str, str, str], None],
) -> bodies.Session:
    """Redeem a link's code for this browser: the service asks the pool leader as itself (its
    own MUNGE credential; pool.api_users), which hands back the link's token sealed for the
    service's uid alone, once. `remember(token, user, the pool's words)` keeps who it is
    (api/identity.Tokens), so the page's first reads do not ask again.

    Raises:
        Problem: 401 (a code used, expired or never made), 403 (another site's page), or as
            Service.ask.
    """
    same_origin(request)
    itself = Identity(service.account)
    reply = service.ask(itself, Verb.TOKEN, {"action": "signin", "code": code})
    if not reply.ok:
        raise unauthorized(reply.message)
    token = service.unseal(reply.sealed)
    claims, _ = parse_token(token)
    remember(token, claims.user, reply.message)
    secure = request.url.scheme == "https"
    response.set_cookie(
        SECURE_COOKIE if secure else PLAIN_COOKIE,
        token,
        max_age=max(1, int(claims.expires_s - service.clock())),
        path="/",
        secure=secure,
        httponly=True,
        samesite="strict",
    )
    return document(token, claims.user, is_operator(reply.message), with_csrf=True)


def sign_out(response: Response) -> None:
    for name in (SECURE_COOKIE, PLAIN_COOKIE):
        response.delete_cookie(
            name, path="/", secure=name == SECURE_COOKIE, httponly=True, samesite="strict"
        )
