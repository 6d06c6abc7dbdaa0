"""The job's speed hash and slow verdicts (keys.SPEEDS_KEY, keys.SLOW_KEY; issue 42).

Each node writes its own field of the speed hash once a window (job/speed.py). It is a figure,
not a claim: the leader judges only a field of the record's generation and of a member, and
only against the other members' (job/slowness.py). The leader writes the verdicts and removes
the speeds of nodes that are no longer members, fenced by its lease (the copies hash's script,
coord/handouts.py, on these hashes).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TypeVar

import redis

from nodeagent.coord.errors import redis_errors
from nodeagent.coord.handouts import HAND_OUT
from nodeagent.coord.keys import JobKeys
from nodeagent.coord.lua import Call
from nodeagent.errors import CorruptStateError
from nodeagent.model.speed import NodeSpeed, SlowVerdict

log = logging.getLogger(__name__)
T = TypeVar("T", NodeSpeed, SlowVerdict)
MAX_FIELDS = 100_000  # a hash with more is not one nodeagent wrote: not read


class SpeedHashes:
    def __init__(self, client: redis.Redis, keys: JobKeys) -> None:
        self.client = client
        self.keys = keys
        self._fenced_write = HAND_OUT.bind(client)
        self._said: dict[str, set[str]] = {}  # by key: garbage logged, once while it stays

    def put(self, speed: NodeSpeed) -> None:
        """This node's window. Raises: CoordinationError."""
        with redis_errors("write this node's speed"):
            self.client.hset(self.keys.speeds, speed.node, speed.to_json())

    def speeds(self) -> dict[str, NodeSpeed]:
        """Every node's latest window; garbage reported and left out. Raises: CoordinationError."""
        return self._read(self.keys.speeds, NodeSpeed)

    def verdicts(self) -> dict[str, SlowVerdict]:
        """The nodes the leader named slow. Raises: CoordinationError."""
        return self._read(self.keys.slow, SlowVerdict)

    def _read(self, key: str, kind: type[T]) -> dict[str, T]:
        try:
            with redis_errors(f"read {key}"):  # HGETALL alone: the ACLs allow no more
                raw = self.client.hgetall(key)
            if len(raw) > MAX_FIELDS:
                raise CorruptStateError(f"{key} holds more than {MAX_FIELDS} fields")
        except CorruptStateError as exc:  # not a hash: read as empty
            self._garbage(key, {str(exc)})
            return {}
        found: dict[str, T] = {}
        bad = set()
        for name, value in raw.items():
            field = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
            try:
                item = kind.from_json(value)
            except CorruptStateError as exc:
                bad.add(f"field {field}: {exc}")
                continue
            if item.node == field:
                found[field] = item
            else:
                bad.add(f"field {field} of {key} names node {item.node}")
        self._garbage(key, bad)
        return found

    def _garbage(self, key: str, problems: set[str]) -> None:
        """Log each problem once while it stays (it is left out: never judged, never shown)."""
        for problem in sorted(problems - self._said.get(key, set())):
            log.warning("garbage in Redis: %s (ignored)", problem)
        self._said[key] = problems

    def write_verdicts(
        self,
        leader: str,
        put: Sequence[SlowVerdict],
        gone: Sequence[str],
        drop_speeds: Sequence[str],
    ) -> None:
        """The leader's verdicts written and removed, and the speeds of nodes that left
        dropped, fenced by the leader lease `leader`. Raises: FencedError, CoordinationError."""
        for key, pairs, drop in (
            (self.keys.slow, [(v.node, v.to_json()) for v in put], list(gone)),
            (self.keys.speeds, [], list(drop_speeds)),
        ):
            if not pairs and not drop:
                continue
            call = Call(
                {"leader": self.keys.leader, "copies": key},
                {"leader_value": leader, "reset": "0"},
                [len(pairs), *(part for pair in pairs for part in pair), *drop],
            )
            with redis_errors("write the slow verdicts"):
                self._fenced_write(call)
