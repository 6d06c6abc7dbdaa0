"""The pool leader's side of API tokens (model/token.py): who a token credential names, minting
one for a MUNGE-authenticated caller, and revoking.

A token is minted only for the caller whose own MUNGE credential signed the request (not for a
token's holder, nor for a caller the API service vouches for): a token never makes another
one, so its lifetime bounds what a stolen one can do. It goes back to its user inside a MUNGE
credential restricted to their uid; the reply in Redis gives no one else anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from nodeagent.coord.tokens import TokenStore
from nodeagent.model.credential import Decoded, MungeUnavailable
from nodeagent.model.request import Caller, Request
from nodeagent.model.token import (
    TokenError,
    credential_claims,
    new_claims,
    sealed_payload,
    secret_of,
)
from nodeagent.pool.authority import Authority, not_taken

OPERATOR = " (an operator)"


def who_is(caller: Caller) -> str:
    """WHOAMI's answer, which the API service reads (`is_operator`)."""
    return f"you are {caller.name}" + (OPERATOR if caller.operator else "")


def is_operator(message: str) -> bool:
    return message.endswith(OPERATOR)


class TokenRefused(Exception):
    """A token verb the caller may not make: the reply says why."""


@dataclass(frozen=True)
class Minted:
    message: str
    sealed: str  # a MUNGE credential only the caller's uid decodes, carrying the token


class Tokens:
    def __init__(self, store: TokenStore, authority: Authority) -> None:
        self._store = store
        self._authority = authority

    def identify(self, request: Request, now_s: int) -> Decoded | str:
        """Who a request signed with a token comes from, as a decoded credential valid while
        its proof is (the replay memory keeps it that long), or why it is refused."""
        return self._authority.token_holder(
            request.credential, request.digest, self._store.live, now_s
        )

    def apply(
        self, caller: Caller, request: Request, munge_signed: bool, now_s: int
    ) -> str | Minted:
        """TOKEN {action: mint, lifetime_s}, {action: revoke, id} or {action: signin}.

        Raises:
            TokenRefused: why not.
        """
        args = request.args
        action = args.get("action")
        if action == "signin":
            return self._sign_in(caller, request, munge_signed, now_s)
        if action == "mint":
            if not munge_signed:
                raise TokenRefused(
                    "a token is minted only for a MUNGE credential's own caller "
                    "(nodeagentctl token), not with a token or through the API"
                )
            return self._mint(caller, args.get("lifetime_s"), now_s)
        if action == "revoke":
            return self._revoke(caller, args.get("id"))
        raise TokenRefused(f"token: expected mint, revoke or signin, got {str(action)[:32]!r}")

    def _mint(self, caller: Caller, lifetime: object, now_s: int) -> Minted:
        key, pool = self._authority.token_key, self._store.keys.pool
        if key is None:
            raise TokenRefused(not_taken(pool))
        longest = int(self._authority.pool.tokens.max_lifetime)
        if not isinstance(lifetime, int) or isinstance(lifetime, bool) or lifetime < 60:
            raise TokenRefused(
                f"token lifetime: expected whole seconds, 60 or more, got {lifetime!r}"
            )
        if lifetime > longest:
            raise TokenRefused(
                f"token lifetime {lifetime} s is over this pool's maximum of {longest} s "
                "(pool.tokens.max_lifetime)"
            )
        claims = new_claims(pool, caller.name, caller.uid, caller.gid, now_s, lifetime)
        payload = sealed_payload(claims, secret_of(key, claims))
        try:
            sealed = self._authority.munge.encode(payload, ttl_s=300, restrict_uid=caller.uid)
        except MungeUnavailable as exc:
            raise TokenRefused(f"the pool leader cannot hand the token out: {exc}") from None
        if not self._store.add(claims, now_s):
            raise TokenRefused("this pool's token register is full: revoke tokens first")
        return Minted(f"token {claims.id} for {caller.name}, valid {lifetime} s", sealed)

    def _sign_in(self, caller: Caller, request: Request, munge_signed: bool, now_s: int) -> str:
        """A browser signs in with the token that signs this request, once (`nodeagentctl
        ui`'s link): a link found later in a history or a terminal's scroll-back signs no one
        in again. The reply names the caller as WHOAMI's does."""
        if munge_signed or not request.credential:
            raise TokenRefused("signin: a browser signs in with a token (nodeagentctl ui)")
        try:
            token_id = credential_claims(request.credential).id
        except TokenError as exc:
            raise TokenRefused(f"signin: {exc}") from None
        before = self._store.sign_in(token_id, now_s)
        if before is not None:
            raise TokenRefused(
                f"token {token_id} signed a browser in already, {max(0, now_s - before)} s ago: "
                "a sign-in link works once (nodeagentctl ui makes another)"
            )
        return who_is(caller)

    def _revoke(self, caller: Caller, token_id: object) -> str:
        if not isinstance(token_id, str) or not token_id or len(token_id) > 64:
            raise TokenRefused(f"token revoke: expected a token id or all, got {token_id!r}")
        listing = self._store.listing()
        if token_id == "all":
            mine = [i for i, entry in listing.items() if entry["uid"] == caller.uid]
            return f"revoked {self._store.revoke(mine)} token(s) of {caller.name}"
        entry = listing.get(token_id)
        if entry is None:
            raise TokenRefused(f"no token {token_id} (expired, revoked, or never minted)")
        if entry["uid"] != caller.uid and not caller.operator:
            raise TokenRefused(f"{caller.name} may not revoke token {token_id} of {entry['user']}")
        self._store.revoke([token_id])
        return f"token {token_id} of {entry['user']} revoked by {caller.name}"
