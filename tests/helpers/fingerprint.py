"""What a write to Redis would change, to show that a refused command changed nothing."""

from __future__ import annotations

from typing import Any

import redis


def fingerprint(client: redis.Redis) -> dict[str, Any]:
    """The set of keys of `client`'s database, every stream's length and last entry, and every
    hash but a job record (`...:job`, which the leader may rewrite at any time) and the digests
    of the nodes' reports (`...:digests`, which follow each report as its agent writes it; the
    reports' own keys are compared by kind only)."""
    found: dict[str, Any] = {}
    for key in sorted(str(k) for k in client.keys("*")):
        kind = client.type(key)
        if kind == "stream":
            last = client.xrevrange(key, count=1)
            found[key] = ("stream", client.xlen(key), last[0][0] if last else None)
        elif kind == "hash" and not key.endswith((":job", ":digests")):
            found[key] = ("hash", client.hgetall(key))
        else:
            found[key] = kind
    return found
