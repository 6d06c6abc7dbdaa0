"""A pool's queues in Redis (`nodeagentctl queue`, the pool leader's queue requests): one read
and the writes, each with its event. The pool read (coord/pool.py) reads them all."""

from __future__ import annotations

from typing import Any

import redis

from nodeagent.coord import streams
from nodeagent.coord.errors import redis_errors
from nodeagent.coord.keys import PoolKeys
from nodeagent.coord.poolreplies import queue_of
from nodeagent.model.job import Event
from nodeagent.model.queues import QueueView


def queue(client: redis.Redis, keys: PoolKeys, name: str) -> QueueView | None:
    """One queue as an operator made it (None: not made, or unreadable), without reading the
    whole pool."""
    with redis_errors("read a queue"):
        raw: Any = client.hget(keys.queues, name)
    return queue_of(name, raw)


def set_queue(
    client: redis.Redis, keys: PoolKeys, queue: QueueView, by: str, created: bool
) -> None:
    """Create or change a queue (nodeagentctl queue create|set)."""
    how = "created" if created else "changed"
    event = Event(
        f"queue_{how}",
        message=f"queue {queue.name} {how} by {by}: {queue.describe()}",
        data={"queue": queue.name, "by": by},
    )
    streams.write_with_event(
        client,
        "pool queue",
        lambda pipe: pipe.hset(keys.queues, queue.name, queue.to_json()),
        keys.events,
        event,
    )


def delete_queue(client: redis.Redis, keys: PoolKeys, name: str, by: str) -> bool:
    """Remove a queue; False if there was none."""
    event = Event("queue_deleted", message=f"queue {name} deleted by {by}", data={"queue": name})
    removed = streams.write_with_event(
        client,
        "pool queue",
        lambda pipe: pipe.hdel(keys.queues, name),
        keys.events,
        event,
    )
    return bool(removed)
