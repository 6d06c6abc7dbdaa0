"""Reading Redis streams (a job's events and commands, a pool's events), for every store."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis

from nodeagent.coord.errors import redis_errors
from nodeagent.coord.keys import EVENTS_MAXLEN
from nodeagent.model.job import Event


def last_id(client: redis.Redis, stream: str) -> str:
    """The newest entry ID of `stream` ("0-0" when empty or absent)."""
    with redis_errors("read events"):
        last: Any = client.xrevrange(stream, "+", "-", count=1)
    return str(last[0][0]) if last else "0-0"


def wait(client: redis.Redis, after: dict[str, str], block_ms: int) -> list[tuple[str, str, Any]]:
    """Block until an entry arrives on one of the streams in `after` (stream -> last ID)."""
    with redis_errors("wait for events"):
        reply: Any = client.xread(after, block=block_ms)  # type: ignore[arg-type]
    return [(stream, entry_id, fields) for stream, entries in reply for entry_id, fields in entries]


def write_with_event(
    client: redis.Redis, what: str, change: Callable[[Any], object], stream: str, event: Event
) -> Any:
    """`change` (one command on a pipeline) and the event that tells of it, in one MULTI/EXEC
    (their keys share a slot); the change's reply."""
    with redis_errors(what):
        pipe = client.pipeline(transaction=True)
        change(pipe)
        pipe.xadd(stream, {"event": event.to_json()}, maxlen=EVENTS_MAXLEN, approximate=True)
        result, _ = pipe.execute()
    return result
