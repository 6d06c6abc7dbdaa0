"""API tokens (model/token.py): what a token and a request's token credential are, and every
way a credential is refused. Pure: no Redis, no munged."""

from __future__ import annotations

import base64
import json

import pytest

from nodeagent.model.token import (
    FRESH_S,
    Claims,
    Proven,
    TokenError,
    check_credential,
    credential,
    new_claims,
    parse_token,
    sealed_payload,
    secret_of,
    token_text,
    unsealed,
)

KEY = b"k" * 32
NOW = 1_800_000_000
DIGEST = "ab" * 32


def token(key: bytes = KEY, pool: str = "default", lifetime: int = 3600) -> tuple[Claims, str]:
    claims = new_claims(pool, "alice", 1001, 1001, NOW, lifetime)
    return claims, token_text(claims, secret_of(key, claims))


def test_a_token_says_whose_it_is_and_proves_one_request_at_one_time() -> None:
    claims, text = token()
    assert text.startswith("nat1.")
    assert parse_token(text) == (claims, secret_of(KEY, claims))
    assert unsealed(sealed_payload(claims, secret_of(KEY, claims))) == text
    made = credential(text, DIGEST, NOW)
    assert secret_of(KEY, claims).hex() not in made  # the secret never travels
    found = check_credential(KEY, made, DIGEST, "default", NOW + 10)
    assert found == Proven(claims, NOW + FRESH_S)


def _altered(made: str) -> str:
    head, claims, at, proof = made.split(".")
    body = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
    body["user"] = "root"
    body["uid"] = 0
    raw = base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")
    return ".".join([head, raw, at, proof])


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("another key", "token forged or altered: not made with this pool's token key"),
        ("claims altered", "token forged or altered: not made with this pool's token key"),
        ("another request", "token forged or altered: not made with this pool's token key"),
        ("another pool", "token made for pool other, not default"),
        ("expired", "expired: mint another (nodeagentctl token)"),
        ("signed long ago", f"s from now: more than {FRESH_S} s (clocks?)"),
        ("garbage", "not a token credential: expected token1.<claims>.<time>.<proof>"),
        ("bad claims", "not a nodeagent token: token claims is not a JSON object"),
    ],
)
def test_a_credential_is_refused(case: str, why: str) -> None:
    _, text = token(key=b"x" * 32 if case == "another key" else KEY)
    now = NOW + 10
    digest = DIGEST
    if case == "another pool":
        _, text = token(pool="other")
    if case == "expired":
        _, text = token(lifetime=60)
        now = NOW + 61
    made = credential(text, "cd" * 32 if case == "another request" else digest, NOW)
    if case == "signed long ago":
        now = NOW + FRESH_S + 1
    if case == "claims altered":
        made = _altered(made)
    if case == "garbage":
        made = "token1.nothing"
    if case == "bad claims":
        made = "token1.WzFd.1.00"  # base64url of [1]
    found = check_credential(KEY, made, digest, "default", now)
    assert isinstance(found, str) and why in found, found


@pytest.mark.parametrize(
    "text",
    ["", "Bearer x", "nat1.onlyone", "nat1.e30.c2hvcnQ", "nat1.!!.AAAA", "nat1." + "A" * 2000],
)
def test_what_is_not_a_token_says_so(text: str) -> None:
    with pytest.raises(TokenError, match="not a nodeagent token"):
        parse_token(text)
