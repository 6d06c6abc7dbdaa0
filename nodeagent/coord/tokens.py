"""A pool's register of API tokens not revoked (model/token.py): the pool leader adds a token
it mints and removes one revoked; a token whose id is not here is refused. What it holds is no
secret (ids, owners, times: `nodeagentctl token --list` reads it); only the agents write it
(the submitters' Redis ACL appends requests only)."""

from __future__ import annotations

import json
from typing import Any

import redis

from nodeagent.coord.errors import redis_errors
from nodeagent.coord.keys import PoolKeys
from nodeagent.errors import CorruptStateError
from nodeagent.model.decode import Reader
from nodeagent.model.token import Claims, TokenError

MAX_TOKENS = 100_000  # a register past this refuses to mint (pruned of expired ones first)


def _entry(claims: Claims) -> str:
    body = {"user": claims.user, "uid": claims.uid, "iat": claims.issued_s, "exp": claims.expires_s}
    return json.dumps(body, separators=(",", ":"), sort_keys=True)


class TokenStore:
    def __init__(self, client: redis.Redis, keys: PoolKeys) -> None:
        self.client = client
        self.keys = keys

    def live(self, token_id: str) -> bool:
        """The token of this id was minted and not revoked."""
        with redis_errors("read the token register"):
            found: Any = self.client.hexists(self.keys.tokens, token_id)
        return bool(found)

    def add(self, claims: Claims, now_s: int) -> bool:
        """Register a minted token (after pruning those expired by `now_s`); False when the
        register is full."""
        self.prune(now_s)
        with redis_errors("register a token"):
            if int(self.client.hlen(self.keys.tokens)) >= MAX_TOKENS:
                return False
            self.client.hset(self.keys.tokens, claims.id, _entry(claims))
        return True

    def revoke(self, token_ids: list[str]) -> int:
        if not token_ids:
            return 0
        with redis_errors("revoke tokens"):
            return int(self.client.hdel(self.keys.tokens, *token_ids))

    def add_signin(self, code_hash: str, claims: Claims, until_s: int, now_s: int) -> None:
        """A sign-in link's code (by its hash: the code itself is never stored) for the token
        of `claims`, redeemable once until `until_s`; expired ones are forgotten first."""
        entry = json.loads(claims.canonical()) | {"until": until_s}
        with redis_errors("register a sign-in link"):
            raw: Any = self.client.hgetall(self.keys.signins)
            gone = [h for h, text in raw.items() if _until(text) <= now_s]
            pipe = self.client.pipeline(transaction=False)
            if gone:
                pipe.hdel(self.keys.signins, *gone)
            pipe.hset(self.keys.signins, code_hash, json.dumps(entry, sort_keys=True))
            pipe.execute()

    def take_signin(self, code_hash: str, now_s: int) -> Claims | None:
        """The token a sign-in code names, taken once (None: no such code, used, expired)."""
        with redis_errors("take a sign-in link"):
            pipe = self.client.pipeline(transaction=True)
            pipe.hget(self.keys.signins, code_hash)
            pipe.hdel(self.keys.signins, code_hash)
            raw, taken = pipe.execute()
        if raw is None or not taken or _until(raw) <= now_s:
            return None
        try:
            doc = json.loads(raw)
            fields = {k: doc[k] for k in ("id", "pool", "user", "uid", "gid", "iat", "exp")}
            return Claims.from_canonical(json.dumps(fields).encode())
        except (ValueError, KeyError, TypeError, TokenError):
            return None

    def listing(self) -> dict[str, dict[str, Any]]:
        """Every registered token: id -> {user, uid, iat, exp}; an entry nodeagent did not
        write is left out."""
        with redis_errors("read the token register"):
            raw: Any = self.client.hgetall(self.keys.tokens)
        found: dict[str, dict[str, Any]] = {}
        for token_id, text in raw.items():
            try:
                r = Reader.of(text, f"token {token_id}")
                found[str(token_id)] = {
                    "user": r.text("user", max_len=256),
                    "uid": r.integer("uid"),
                    "iat": r.integer("iat"),
                    "exp": r.integer("exp"),
                }
            except CorruptStateError:
                continue
        return found

    def prune(self, now_s: int) -> None:
        """Forget the tokens expired by `now_s` (they are refused by their expiry anyway)."""
        gone = [i for i, entry in self.listing().items() if entry["exp"] <= now_s]
        self.revoke(gone)


def _until(text: str) -> int:
    try:
        until = json.loads(text).get("until")
    except (ValueError, AttributeError):
        return 0
    return until if isinstance(until, int) else 0
