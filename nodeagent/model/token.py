"""API tokens: who a client outside the MUNGE perimeter is, vouched for by the pool. Pure.

Slurm's `scontrol token` is the model: a MUNGE-authenticated user asks the pool for a token
with a bounded lifetime; the pool's agents alone hold the key that makes and checks them (the
Ansible role distributes it, `pool.tokens.key_file`), so the API service, which forwards
requests, holds no power of its own.

A token is its claims (id, pool, user, uid, gid, issued, expires) and their secret,
HMAC-SHA256(key, claims): `nat1.<claims>.<secret>`, both base64url. The secret never goes into
Redis, which every submitter reads:
- it comes back to the user who asked inside a MUNGE credential only that user's uid can decode
  (`munge --restrict-uid`: MUNGE encrypts the payload);
- a request signed with a token carries the claims, the time it was signed and a proof,
  HMAC-SHA256(secret, time + the request's digest): the pool leader makes the secret again from
  the claims and its key and checks the proof. A proof names one request at one time: it is good
  for `FRESH_S` seconds and taken once (the pool's replay memory), so reading it from the
  requests stream gives nothing else.

A token is revoked by removing its id from the pool's token register (coord/tokens.py): a
token whose id is not there is refused, whatever its signature.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass

from nodeagent.errors import CorruptStateError
from nodeagent.model.decode import Reader

TOKEN_PREFIX = "nat1."  # what a user holds
CREDENTIAL_PREFIX = "token1."  # what a request carries instead of a MUNGE credential
SEALED_PREFIX = "nodeagent-token-v1 "  # the payload of the MUNGE credential that hands one out
FRESH_S = 300  # a request's proof is taken this long after (and before) it was made
DEFAULT_LIFETIME_S = 3600
TOKEN_MAX_CHARS = 1024


class TokenError(ValueError):
    """A token or a token credential that is not one (said in words a user can act on)."""


@dataclass(frozen=True)
class Claims:
    """What a token says: whose it is, for which pool, from when to when (seconds since the
    epoch, the minting agent's clock)."""

    id: str
    pool: str
    user: str
    uid: int
    gid: int
    issued_s: int
    expires_s: int

    def canonical(self) -> bytes:
        body = {
            "id": self.id,
            "pool": self.pool,
            "user": self.user,
            "uid": self.uid,
            "gid": self.gid,
            "iat": self.issued_s,
            "exp": self.expires_s,
        }
        return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_canonical(cls, raw: bytes) -> Claims:
        """Raises: TokenError."""
        try:
            r = Reader.of(raw, "token claims")
            return cls(
                id=r.text("id", max_len=64),
                pool=r.name("pool"),
                user=r.text("user", max_len=256),
                uid=r.integer("uid"),
                gid=r.integer("gid"),
                issued_s=r.integer("iat"),
                expires_s=r.integer("exp"),
            )
        except CorruptStateError as exc:
            raise TokenError(f"not a nodeagent token: {exc}") from None


def new_claims(pool: str, user: str, uid: int, gid: int, now_s: int, lifetime_s: int) -> Claims:
    return Claims(secrets.token_hex(8), pool, user, uid, gid, now_s, now_s + lifetime_s)


def secret_of(key: bytes, claims: Claims) -> bytes:
    """The token's secret: only a holder of the pool's key makes it."""
    return hmac.new(key, b"nodeagent-token-v1\0" + claims.canonical(), hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str, what: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise TokenError(f"not a nodeagent token: its {what} is not base64url") from None


def token_text(claims: Claims, secret: bytes) -> str:
    """What the user holds (and gives the API as `Authorization: Bearer ...`)."""
    return f"{TOKEN_PREFIX}{_b64(claims.canonical())}.{_b64(secret)}"


def parse_token(text: str) -> tuple[Claims, bytes]:
    """Raises: TokenError naming what is wrong (never what the secret is)."""
    if len(text) > TOKEN_MAX_CHARS or not text.startswith(TOKEN_PREFIX):
        raise TokenError(f"not a nodeagent token: it starts with {TOKEN_PREFIX!r}")
    parts = text[len(TOKEN_PREFIX) :].split(".")
    if len(parts) != 2:
        raise TokenError("not a nodeagent token: expected nat1.<claims>.<secret>")
    secret = _unb64(parts[1], "secret")
    if len(secret) != 32:
        raise TokenError("not a nodeagent token: its secret is not 32 bytes")
    return Claims.from_canonical(_unb64(parts[0], "claims")), secret


def sealed_payload(claims: Claims, secret: bytes) -> str:
    """The payload of the MUNGE credential that hands a minted token to its user."""
    return SEALED_PREFIX + token_text(claims, secret)


def unsealed(payload: str) -> str:
    """The token inside a hand-out credential's payload. Raises: TokenError."""
    if not payload.startswith(SEALED_PREFIX):
        raise TokenError("the pool's answer does not carry a token")
    return payload[len(SEALED_PREFIX) :]


def _proof(secret: bytes, at_s: int, digest: str) -> str:
    message = f"nodeagent-request-v1 {at_s} {digest}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def credential(token: str, digest: str, at_s: int) -> str:
    """A request's credential made with `token` at `at_s`: the claims, the time, the proof of
    the request whose canonical digest is `digest`. Raises: TokenError."""
    claims, secret = parse_token(token)
    return f"{CREDENTIAL_PREFIX}{_b64(claims.canonical())}.{at_s}.{_proof(secret, at_s, digest)}"


def is_token_credential(text: str) -> bool:
    return text.startswith(CREDENTIAL_PREFIX)


@dataclass(frozen=True)
class Proven:
    """A token credential that checked: whose token, and when its proof stops being taken."""

    claims: Claims
    fresh_until_s: int


def check_credential(key: bytes, text: str, digest: str, pool: str, now_s: int) -> Proven | str:
    """The claims when `text` proves the request of `digest` with a live token of `pool`,
    else why not (the register of unrevoked tokens is the caller's to ask)."""
    parts = text[len(CREDENTIAL_PREFIX) :].split(".")
    if not is_token_credential(text) or len(parts) != 3 or not parts[1].isdigit():
        return "not a token credential: expected token1.<claims>.<time>.<proof>"
    try:
        claims = Claims.from_canonical(_unb64(parts[0], "claims"))
    except TokenError as exc:
        return str(exc)
    at_s = int(parts[1])
    expected = _proof(secret_of(key, claims), at_s, digest)
    if not hmac.compare_digest(expected, parts[2]):
        return "token forged or altered: not made with this pool's token key"
    if claims.pool != pool:
        return f"token made for pool {claims.pool}, not {pool}"
    if now_s >= claims.expires_s:
        return f"token {claims.id} expired: mint another (nodeagentctl token)"
    if abs(now_s - at_s) > FRESH_S:
        return f"request signed {now_s - at_s} s from now: more than {FRESH_S} s (clocks?)"
    return Proven(claims, min(at_s + FRESH_S, claims.expires_s))
