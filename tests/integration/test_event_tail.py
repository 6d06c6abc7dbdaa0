"""coord/eventlog.DecodedTail against a real redis-server: a long-lived reader of a pool's
events (the API service's `show`) gets what reading and decoding the whole tail would give,
while reading only what came since its last read."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nodeagent.coord import eventlog
from nodeagent.coord.client import connect
from nodeagent.coord.eventlog import DecodedTail
from nodeagent.coord.keys import PoolKeys
from nodeagent.coord.pool import PoolStore
from nodeagent.model.job import Event
from tests.helpers.cluster import RedisServer


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[PoolStore]:
    found = PoolStore(connect(redis_server.url, 10.0), PoolKeys("nodeagent", "tail"))
    yield found
    found.client.close()


def add(store: PoolStore, *jobs: str) -> None:
    for job in jobs:
        event = Event("job_requeued", message=f"job {job}", data={"job": job})
        store.client.xadd(store.keys.events, {"event": event.to_json()})


class Counting:
    """The store's client, counting the stream entries each read hands back."""

    def __init__(self, store: PoolStore) -> None:
        self.entries: list[int] = []
        self._xrange, self._xrevrange = store.client.xrange, store.client.xrevrange
        store.client.xrange = self._count(self._xrange)  # type: ignore[method-assign]
        store.client.xrevrange = self._count(self._xrevrange)  # type: ignore[method-assign]

    def _count(self, read: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            found = read(*args, **kwargs)
            self.entries.append(len(found))
            return found

        return counted


def test_a_kept_tail_reads_only_what_came_and_gives_what_a_whole_read_gives(
    store: PoolStore,
) -> None:
    add(store, "a", "b", "c")
    store.client.xadd(store.keys.events, {"event": "not an event"})  # someone else's: left out
    tail = DecodedTail(5)
    reads = Counting(store)
    assert [e.data["job"] for e in tail.read(store)] == ["a", "b", "c"]
    add(store, "d")
    assert tail.read(store) == eventlog.decoded(store, 5)[-4:]
    assert reads.entries[1] == 1  # the new entry alone
    assert tail.read(store)[-1].data["job"] == "d" and reads.entries[3] == 0  # nothing new
    add(store, *"efghijk")  # more than it keeps came: read from the tail again
    assert [e.data["job"] for e in tail.read(store)] == list("ghijk")
    assert tail.read(store) == eventlog.decoded(store, 5)
