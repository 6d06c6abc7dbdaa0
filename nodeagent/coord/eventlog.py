"""A job's or a pool's event stream as stored, for `nodeagentctl events [--pool]`.

JobStore.events_tail decodes every entry and turns one it cannot decode into a `corrupt_event`
that says why; nodeagentctl also shows what the entry holds, so it reads the entries as they are.
"""

from __future__ import annotations

import threading
from collections import deque
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


class DecodedTail:
    """A stream's newest `count` events, decoded, kept between reads by one long-lived reader
    (the API service's `show` of a pool job reads the pool's whole stream for its requeues:
    10,000 events read and decoded took ~300 ms at each read). Each read takes only the entries
    after the last one held (stream ids grow with the time they were written), so each event is
    decoded once; a gap wider than `count` starts again from the tail."""

    def __init__(self, count: int) -> None:
        self._count = count
        self._events: deque[Event] = deque(maxlen=count)
        self._last: str | None = None
        self._lock = threading.Lock()  # the service's reads run in worker threads

    def read(self, store: JobStore | PoolStore) -> list[Event]:
        """The newest events, oldest first, as `decoded` gives them.

        Raises:
            CoordinationError: Redis could not be read.
        """
        with self._lock:
            entries = None if self._last is None else _after(store, self._last, self._count)
            if entries is None or len(entries) >= self._count:
                self._events.clear()
                entries = tail(store, self._count)
            for entry_id, fields in entries:
                self._last = entry_id
                try:
                    self._events.append(Event.from_stream(entry_id, fields.get("event", "")))
                except CorruptStateError:
                    continue
            return list(self._events)


def _after(store: JobStore | PoolStore, last: str, count: int) -> list[tuple[str, dict[str, str]]]:
    try:
        entries: Any = store.client.xrange(store.keys.events, f"({last}", "+", count=count)
    except redis.RedisError as exc:
        raise CoordinationError(f"read events: {type(exc).__name__}: {exc}") from exc
    return [(str(entry_id), dict(fields)) for entry_id, fields in entries]
