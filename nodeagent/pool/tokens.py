"""The pool leader's side of API tokens (model/token.py): who a token credential names, minting
one for a MUNGE-authenticated caller, and revoking.

A token is minted only for the caller whose own MUNGE credential signed the request (not for a
token's holder, nor for a caller the API service vouches for): a token never makes another
one, so its lifetime bounds what a stolen one can do. It goes back to its user inside a MUNGE
credential restricted to their uid; the reply in Redis gives no one else anything.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from nodeagent.coord.tokens import TokenStore
from nodeagent.model.credential import Decoded, MungeStatus, MungeUnavailable
from nodeagent.model.request import Caller, Request
from nodeagent.model.token import new_claims, sealed_payload, secret_of
from nodeagent.pool.authority import Authority, not_taken

OPERATOR = " (an operator)"
SIGNIN_S = 600  # a sign-in link is good this long (and once)
_HASH = re.compile(r"^[0-9a-f]{64}$")


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

    def identify(
        self, request: Request, now_s: int, live: Callable[[str], bool] | None = None
    ) -> Decoded | str:
        """Who a request signed with a token comes from, as a decoded credential valid while
        its proof is (the replay memory keeps it that long), or why it is refused; `live`:
        whether a token is registered and not revoked (default: the register, read)."""
        return self._authority.token_holder(
            request.credential, request.digest, live or self._store.live, now_s
        )

    def apply(
        self, caller: Caller, request: Request, munge_signed: bool, now_s: int
    ) -> str | Minted:
        """TOKEN {action: mint, lifetime_s[, signin]}, {action: revoke, id} or {action:
        signin, code}.

        Raises:
            TokenRefused: why not.
        """
        args = request.args
        action = args.get("action")
        if action == "signin":
            return self._sign_in(caller, args.get("code"), munge_signed, now_s)
        if action == "mint":
            if not munge_signed:
                raise TokenRefused(
                    "a token is minted only for a MUNGE credential's own caller "
                    "(nodeagentctl token), not with a token or through the API"
                )
            return self._mint(caller, args.get("lifetime_s"), args.get("signin"), now_s)
        if action == "revoke":
            return self._revoke(caller, args.get("id"))
        raise TokenRefused(f"token: expected mint, revoke or signin, got {str(action)[:32]!r}")

    def _mint(self, caller: Caller, lifetime: object, signin: object, now_s: int) -> Minted:
        """A token for `caller`: handed back sealed for their uid, or, with `signin` (the hash
        of a sign-in link's code, `nodeagentctl ui`), to no one yet: the API service takes it
        once for the browser that brings the code (`_sign_in`)."""
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
        if signin is not None and not (isinstance(signin, str) and _HASH.match(signin)):
            raise TokenRefused("token signin: expected the SHA-256 of the link's code, in hex")
        claims = new_claims(pool, caller.name, caller.uid, caller.gid, now_s, lifetime)
        sealed = ""
        if signin is None:
            payload = sealed_payload(claims, secret_of(key, claims))
            sealed = self._seal(payload, caller.uid)
        if not self._store.add(claims, now_s):
            raise TokenRefused("this pool's token register is full: revoke tokens first")
        if isinstance(signin, str):
            self._store.add_signin(signin, claims, min(claims.expires_s, now_s + SIGNIN_S), now_s)
            return Minted(
                f"sign-in link for {caller.name}, good once for {SIGNIN_S} s; the session then "
                f"lasts {lifetime} s (token {claims.id})",
                "",
            )
        return Minted(f"token {claims.id} for {caller.name}, valid {lifetime} s", sealed)

    def _seal(self, payload: str, uid: int) -> str:
        try:
            return self._authority.munge.encode(payload, ttl_s=300, restrict_uid=uid)
        except MungeUnavailable as exc:
            raise TokenRefused(f"the pool leader cannot hand the token out: {exc}") from None

    def _sign_in(self, caller: Caller, code: object, munge_signed: bool, now_s: int) -> Minted:
        """The API service (an account of pool.api_users, by its own MUNGE credential) brings
        the code a browser posted; the token minted for that link goes back sealed for the
        service's uid alone, once: the code was in the link, the token never is. The reply
        names the token's user as WHOAMI's does."""
        if not munge_signed or caller.name not in self._authority.pool.api_users:
            raise TokenRefused(
                f"signin: only the API service's accounts (pool.api_users) redeem a sign-in "
                f"link, not {caller.name}"
            )
        key = self._authority.token_key
        if key is None:
            raise TokenRefused(not_taken(self._store.keys.pool))
        if not isinstance(code, str) or not 16 <= len(code) <= 128:
            raise TokenRefused("signin: expected the link's code")
        claims = self._store.take_signin(hashlib.sha256(code.encode()).hexdigest(), now_s)
        if claims is None or not self._store.live(claims.id):
            raise TokenRefused(
                "this sign-in link is not good (any more): a link works once, for "
                f"{SIGNIN_S // 60} minutes; `nodeagentctl ui` makes another"
            )
        owner = self._authority.caller(
            Decoded(MungeStatus.SUCCESS, claims.uid, claims.gid, "", 0, 0)
        )
        sealed = self._seal(sealed_payload(claims, secret_of(key, claims)), caller.uid)
        return Minted(who_is(replace(owner, name=claims.user)), sealed)

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
