"""Reading Redis streams (a job's events and commands, a pool's events), for every store."""

from __future__ import annotations

from typing import Any

import redis

from nodeagent.coord.errors import redis_errors


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
