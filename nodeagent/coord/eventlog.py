"""A job's or a pool's event stream as stored, for `nodeagentctl events [--pool]`.

JobStore.events_tail decodes every entry and turns one it cannot decode into a `corrupt_event`
that says why; nodeagentctl also shows what the entry holds, so it reads the entries as they are.
"""

from __future__ import annotations

from typing import Any

import redis

from nodeagent.coord.pool import PoolStore
from nodeagent.coord.store import JobStore
from nodeagent.errors import CoordinationError, CorruptStateError
from nodeagent.model.job import Event


def tail(store: JobStore | PoolStore, count: int) -> list[tuple[str, dict[str, str]]]:
    """The newest `count` entries of the job's (or pool's) event stream, oldest first: (ID,
    fields).

    Raises:
        CoordinationError: Redis could not be read (its cause says why).
    """
    try:
        entries: Any = store.client.xrevrange(store.keys.events, "+", "-", count=count)
    except redis.RedisError as exc:
        raise CoordinationError(f"read events: {type(exc).__name__}: {exc}") from exc
    return [(str(entry_id), dict(fields)) for entry_id, fields in reversed(entries)]


def decoded(store: JobStore | PoolStore, count: int) -> list[Event]:
    """The newest `count` events that decode, oldest first (what does not is left out: the
    stream may hold what someone else wrote).

    Raises:
        CoordinationError: Redis could not be read.
    """
    found = []
    for entry_id, fields in tail(store, count):
        try:
            found.append(Event.from_stream(entry_id, fields.get("event", "")))
        except CorruptStateError:
            continue
    return found
