"""A pool's leader serving requests in process (pool/requests.py), and a signer of requests
with a token of this process's user, for tests against a real redis-server."""

from __future__ import annotations

import os
import pwd
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from nodeagent.config.hosts import Resolver
from nodeagent.config.settings import PoolConfig
from nodeagent.coord.client import connect
from nodeagent.coord.durable import NONE, Durability
from nodeagent.coord.keys import PoolKeys
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.requests import RequestStore
from nodeagent.coord.tokens import TokenStore
from nodeagent.model.pool import PoolNode
from nodeagent.model.request import Reply, Request, Verb
from nodeagent.model.token import credential, new_claims, secret_of, token_text
from nodeagent.pool.authority import Authority
from nodeagent.pool.requests import Requests
from nodeagent.supervisor.munge import MungeProgram
from tests.helpers.cluster import RedisServer, wait_for

NEVER = 100_000  # nodes a job asks for: more than the pool has, so it stays pending


Signed = Callable[..., Request]  # (verb, args, request_id="")


def leader_of(
    redis_server: RedisServer,
    pool: str,
    key: bytes | None = None,
    durability: Durability = NONE,
) -> tuple[PoolStore, str, Requests, Signed, str]:
    """The pool's store, its leader's lease value, the leader's Requests, a signer of requests
    with a token of this process's user, and that token's id; `key`: the pool's token key
    (default: a new one)."""
    store = PoolStore(connect(redis_server.url, 10.0), PoolKeys("nodeagent", pool))
    leader = store.sync(
        PoolNode(name="n0", address="127.0.0.1", lease_ttl_ms=600_000, labels={}, metrics="")
    ).leader
    assert leader is not None
    key = key or os.urandom(32)
    tokens = TokenStore(store.client, store.keys)
    me = pwd.getpwuid(os.getuid())
    unused = MungeProgram("/nonexistent")  # token credentials only: munged is never asked
    authority = replace(
        Authority(unused, PoolConfig(name=pool, auth="munge"), Resolver(), key),
        token_live=tokens.live,
    )
    now = int(time.time())
    claims = new_claims(pool, me.pw_name, me.pw_uid, me.pw_gid, now, 3600)
    assert tokens.add(claims, now)
    token = token_text(claims, secret_of(key, claims))

    def signed(verb: Verb, args: dict[str, Any], request_id: str = "") -> Request:
        request = Request(pool, verb, args, request_id=request_id)
        return replace(request, credential=credential(token, request.digest, int(time.time())))

    return store, leader, Requests(store, authority, durability=durability), signed, claims.id


def answered(requests: RequestStore, request_id: str) -> Reply:
    """The answer to `request_id`, once there is one."""
    found: list[Reply] = []

    def replied() -> bool:
        reply = requests.reply(request_id)
        if reply is not None:
            found.append(reply)
        return reply is not None

    wait_for(replied, 30, f"the answer to {request_id}")
    return found[0]


def spec(job: str) -> dict[str, Any]:
    return {"spec": {"id": job, "entrypoint": ["true"], "min_nodes": NEVER, "max_nodes": NEVER}}
