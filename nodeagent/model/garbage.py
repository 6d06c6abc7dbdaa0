"""Garbage found in Redis: what it is, and reporting each piece once.

A value nodeagent did not write (or a key of the wrong type) is never trusted and never allowed
to raise out of the agent's loop: the store turns it into a `Garbage` item and ignores it, or the
leader repairs it. `GarbageLog` reports each item once while it stays there: a log line naming
the key and what is wrong, a count by kind of key (the metrics label: never a node name, which a
writer of garbage chooses), and an event on the job's stream.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from nodeagent.model.job import Event

log = logging.getLogger(__name__)

# The kinds of keys (coord/keys.py), the `key` label of nodeagent_redis_garbage_total.
KINDS = (
    "node",
    "leases",
    "leader",
    "leader-epoch",
    "job",
    "events",
    "commands",
    "cordons",
    "changes",
)
# What a follower reports as an event too: the leader does not read these (there is none while
# the leader key is garbage; each node reads only its own cordon). The leader reports the rest.
FOLLOWER_EVENTS = frozenset({"leader", "leader-epoch", "cordons"})


@dataclass(frozen=True)
class Garbage:
    """One bad value. `problem` is stable while the value stays (no clock readings in it), so
    the same garbage read again is recognised; `action` says what was done about it."""

    kind: str  # one of KINDS
    key: str  # the Redis key
    problem: str
    action: str = "ignored"

    @property
    def ident(self) -> tuple[str, str, str, str]:
        return self.kind, self.key, self.problem, self.action

    def describe(self) -> str:
        return f"{self.key}: {self.problem} ({self.action})"


class GarbageLog:
    """Reports garbage once per appearance: an item seen in consecutive reads is reported the
    first time; one that disappears and comes back is reported again, and so is everything when
    this node becomes or stops being the leader (which reports more)."""

    def __init__(self, node: str = "") -> None:
        self.node = node
        self._seen: set[tuple[str, str, str, str]] = set()
        self._leading = False
        self._pending: list[Event] = []
        self._counters: list[Callable[[str], None]] = []

    def count_with(self, counter: Callable[[str], None]) -> None:
        """Also count each new item by its kind (AgentMetrics.redis_garbage)."""
        self._counters.append(counter)

    def observe(self, items: Iterable[Garbage], leading: bool) -> list[Garbage]:
        """Log, count and queue an event for the items not seen in the previous read."""
        items = list(items)
        if leading != self._leading:  # a new leader reports what only a leader reports
            self._seen, self._leading = set(), leading
        new = [g for g in items if g.ident not in self._seen]
        self._seen = {g.ident for g in items}
        for item in new:
            log.warning("garbage in Redis: %s", item.describe())
            for counter in self._counters:
                counter(item.kind)
            if leading or item.kind in FOLLOWER_EVENTS:
                self._pending.append(
                    Event(
                        "redis_garbage",
                        node=self.node or None,
                        message=item.describe(),
                        data={"kind": item.kind, "key": item.key, "action": item.action},
                    )
                )
        return new

    def take_events(self) -> list[Event]:
        """The events to append with the next heartbeat (then forgotten)."""
        events, self._pending = self._pending, []
        return events

    def put_back(self, events: list[Event]) -> None:
        """Events whose heartbeat failed: send them with the next one."""
        self._pending = events + self._pending
