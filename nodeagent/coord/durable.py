"""What the pool's "done" is worth: a change on `pool.durability.replicas` replicas, or nothing
said but "not acknowledged".

Redis replicates asynchronously: a primary answers a write before any replica has it, and a
failover to a replica that lacked it loses it (a primary frozen long enough to be replaced, then
resumed and demoted, lost every write it took meanwhile). So a write the pool answers "done" to
(a submission, a cancel, a hold, a queue change, a token) is confirmed first: a write of this
connection's own (`acks`, a counter) and Redis `WAIT replicas timeout` on the same connection,
which returns once that many replicas acknowledged everything the primary had taken before it
(Redis applies writes in one order, so every earlier write of any connection is covered). Fewer
within the timeout: NotAcknowledged, which says what the caller can know: the change may or may
not have been kept, and the same request (its request id) may be sent again, never doubling it.

`replicas: 0` (a single Redis, the default) confirms nothing: the write is as safe as Redis's
own persistence (appendfsync). The operator sets it (pool.durability); the pool leader
publishes it beside pool.auth, where nodeagentctl reads it before it writes (`published`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis

from nodeagent.coord.errors import redis_errors
from nodeagent.errors import CoordinationError

MAX_REPLICAS = 16


class NotAcknowledged(CoordinationError):
    """Fewer replicas than asked acknowledged a change within the timeout: it may or may not
    have been kept (nodeagentctl exits 69; the API answers 503)."""


@dataclass(frozen=True)
class Durability:
    replicas: int = 0
    timeout_ms: int = 1000

    def confirm(self, client: redis.Redis, acks: str, what: str = "the change") -> None:
        """Every write Redis took before this call is on `replicas` replicas.

        Raises:
            NotAcknowledged: fewer within the timeout.
            CoordinationError: Redis could not be reached.
        """
        if self.replicas <= 0:
            return
        with redis_errors(f"confirm {what}"):
            pipe = client.pipeline(transaction=False)
            # A write of this connection's: WAIT counts from it. INCR itself (redis-py's incr
            # sends INCRBY, which the Redis role's ACL does not grant).
            pipe.execute_command("INCR", acks)  # type: ignore[no-untyped-call]
            pipe.execute_command("WAIT", self.replicas, self.timeout_ms)  # type: ignore[no-untyped-call]
            found: Any = pipe.execute()
        acked = int(found[-1])
        if acked < self.replicas:
            raise NotAcknowledged(
                f"{what} is not acknowledged: {acked} of {self.replicas} replicas had it within "
                f"{self.timeout_ms} ms (pool.durability); the pool may or may not keep it"
            )

    def to_json(self) -> str:
        return json.dumps({"replicas": self.replicas, "timeout_ms": self.timeout_ms})


def published(client: redis.Redis, key: str) -> Durability:
    """What the pool leader published (none, or unreadable: replicas 0).

    Raises:
        CoordinationError: Redis could not be reached.
    """
    with redis_errors("read the pool's durability"):
        try:
            raw: Any = client.get(key)
        except redis.ResponseError:  # WRONGTYPE: not nodeagent's; the leader rewrites it
            return Durability()
    try:
        doc = json.loads(raw) if raw is not None else {}
        replicas, timeout = int(doc.get("replicas", 0)), int(doc.get("timeout_ms", 1000))
    except (ValueError, TypeError, AttributeError):
        return Durability()
    if not (0 <= replicas <= MAX_REPLICAS and 0 < timeout <= 60_000):
        return Durability()
    return Durability(replicas, timeout)


NONE = Durability()  # confirms nothing: a single Redis
