"""A node's cordon, written the same way by a job's store and a pool's: one field of the
cordons hash and the event that tells of it, in one MULTI/EXEC (their keys share a slot)."""

from __future__ import annotations

from typing import Protocol

import redis

from nodeagent.coord import streams
from nodeagent.model.job import Cordon, cordon_event, uncordon_event


class CordonKeys(Protocol):
    """Where a cordon and its event go (JobKeys and PoolKeys both have them)."""

    @property
    def cordons(self) -> str: ...
    @property
    def events(self) -> str: ...


def put_cordon(client: redis.Redis, keys: CordonKeys, name: str, cordon: Cordon, what: str) -> None:
    """Cordon `name` (`what`: the call, for an error: "cordon", "pool cordon")."""
    streams.write_with_event(
        client,
        what,
        lambda pipe: pipe.hset(keys.cordons, name, cordon.to_json()),
        keys.events,
        cordon_event(name, cordon),
    )


def lift_cordon(client: redis.Redis, keys: CordonKeys, name: str, by: str, what: str) -> bool:
    """Lift `name`'s cordon; False if it had none."""
    removed = streams.write_with_event(
        client,
        what,
        lambda pipe: pipe.hdel(keys.cordons, name),
        keys.events,
        uncordon_event(name, by),
    )
    return bool(removed)
