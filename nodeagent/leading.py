"""The leader's side of an agent: plan from a snapshot, commit it fenced, remember between plans.

`Leadership.lead()` runs leader.plan() on the cluster view and writes the result through the
fenced COMMIT script; the agent applies what it returns (a new record, its revision, whether to
run another tick at once).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from nodeagent.bounded import CallRunner
from nodeagent.coord.store import JobStore, Snapshot
from nodeagent.errors import CoordinationError, FencedError
from nodeagent.leader import LeaderMemory, Plan, Policy, plan
from nodeagent.metrics import AgentMetrics
from nodeagent.model import JobRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Led:
    record: JobRecord | None = None  # the record written, if it changed
    rev: int | None = None  # the record revision after the write
    again: bool = False  # something changed (or the write was refused): tick again at once


class Leadership:
    def __init__(
        self,
        store: JobStore,
        policy: Policy,
        metrics: AgentMetrics,
        lease_ttl_s: float,
        clock: Callable[[], float],
        call: CallRunner,
    ) -> None:
        self._store = store
        self._call = call
        self._policy = policy
        self._metrics = metrics
        self._lease_ttl_ms = int(lease_ttl_s * 1000)
        self._clock = clock
        self._memory = LeaderMemory()
        self._last_reason = ""
        self.next_expiry: float | None = None  # local time the earliest known lease lapses

    def lead(self, token: str, snapshot: Snapshot) -> Led:
        for error in snapshot.errors:
            log.warning("ignoring unreadable data in Redis: %s", error)
        view = snapshot.cluster_view()
        # Wake when the earliest lease lapses (server time converted to local), so a dead node
        # is noticed at its deadline, not up to one heartbeat later.
        deadlines = [lease.deadline_ms for lease in snapshot.leases if lease.name in view.nodes]
        self.next_expiry = (
            self._clock() + (min(deadlines) - snapshot.now_ms) / 1000 + 0.005 if deadlines else None
        )
        decision = plan(view, self._policy, self._memory)
        self._memory = decision.memory
        if decision.reason != self._last_reason:
            log.info("leader: %s", decision.reason)
            self._last_reason = decision.reason
        if decision.record is None and not decision.events and not decision.reap:
            return Led()
        try:
            rev = self._call(
                lambda: self._store.commit(token, snapshot.rev, decision), "leader write"
            )
        except FencedError as exc:
            log.info("leader write refused, re-reading: %s", exc)
            return Led(again=True)
        except CoordinationError as exc:
            log.warning("leader write failed: %s", exc)
            self._metrics.sync_failed()
            return Led()
        self._observe_losses(snapshot, decision)
        return Led(record=decision.record, rev=rev, again=True)

    def _observe_losses(self, snapshot: Snapshot, decision: Plan) -> None:
        for lease in snapshot.leases:
            if lease.name in decision.reap:  # last heartbeat -> noticed, in server time
                lost_for = snapshot.now_ms - (lease.deadline_ms - self._lease_ttl_ms)
                self._metrics.detected("node_lost", lost_for / 1000)
