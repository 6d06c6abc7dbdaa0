"""The leader's side of an agent: plan from a snapshot, commit it fenced, remember between plans.

`Leadership.lead()` runs plan() (job/plan.py) on the cluster view and writes the result through the
fenced COMMIT script; the agent applies what it returns (a new record, its revision, whether to
run another tick at once). Then it hands each node its share of the checkpoint copies
(job/checkpoints/handouts.py). Garbage the leader read is reported by the store (once, counted in
the agent's metrics); the plan removes garbage leases and rewrites a garbage record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from nodeagent.coord.bounded import CallRunner
from nodeagent.coord.store import Snapshot
from nodeagent.errors import CoordinationError, FencedError, IllegalTransition
from nodeagent.job import stalls
from nodeagent.job.checkpoints.handouts import Handouts
from nodeagent.job.plan import LeaderMemory, Policy, plan
from nodeagent.job.port import JobPort
from nodeagent.model import goodput
from nodeagent.model.job import JobRecord
from nodeagent.telemetry.metrics import AgentMetrics

log = logging.getLogger(__name__)
GOODPUT_S = 30.0  # the leader accounts the job's goodput for its metrics this often
EVENTS_READ = 10_000  # the job's whole event stream (coord/keys.py EVENTS_MAXLEN)


@dataclass(frozen=True)
class Led:
    record: JobRecord | None = None  # the record written, if it changed
    rev: int | None = None  # the record revision after the write
    again: bool = False  # something changed (or the write was refused): tick again at once


class Leadership:
    def __init__(
        self,
        store: JobPort,
        policy: Policy,
        metrics: AgentMetrics,
        lease_ttl_s: float,
        clock: Callable[[], float],
        call: CallRunner,
    ) -> None:
        self._store = store
        store.garbage.count_with(metrics.redis_garbage)  # the store counts what it finds
        self._call = call
        self._policy = policy
        self._metrics = metrics
        self._lease_ttl_ms = int(lease_ttl_s * 1000)
        self._clock = clock
        self._memory = LeaderMemory()
        self._handouts = Handouts(store, policy.replicas, call, clock)
        self._last_reason = ""
        self.next_expiry: float | None = None  # local time the earliest known lease lapses
        self.next_poll: float | None = None  # local time it reads the reports again, if sooner
        # when the job's goodput was last accounted, and the generation then
        self._accounted_at: tuple[float, int] | None = None

    def account(self, now_ms: int, generation: int) -> None:
        """Every GOODPUT_S, and when the generation moved: the job's goodput from its events
        (model/goodput.py), for the metrics. The events are read whole (up to EVENTS_READ, about
        2 MB at most): not at every round."""
        now = self._clock()
        due = self._accounted_at is None or now - self._accounted_at[0] >= GOODPUT_S
        if not due and self._accounted_at is not None and self._accounted_at[1] == generation:
            return
        self._accounted_at = (now, generation)
        try:
            events = self._call(lambda: self._store.events_tail(EVENTS_READ), "read the events")
        except CoordinationError as exc:
            log.info("cannot read the job's events to account its goodput: %s", exc)
            return
        found = goodput.account(events, now_ms)
        if found is None:
            self._metrics.goodput(None)
        else:
            self._metrics.goodput(found.parts, found.ettr, found.steps_lost)

    def stepped_down(self) -> None:
        """No longer the leader: its goodput series go (another leader's are current)."""
        if self._accounted_at is not None:
            self._accounted_at = None
            self._metrics.goodput(None)

    def lead(self, token: str, snapshot: Snapshot) -> Led:
        view = snapshot.cluster_view()
        # Wake when the earliest lease lapses (server time converted to local), so a dead node
        # is noticed at its deadline, not up to one heartbeat later. The leader's read gives
        # that deadline exactly; the leases it did not read again hold only lower bounds, which
        # would wake it early, again and again (coord/view.py).
        page = snapshot.page
        if page is not None:
            deadlines = [page.next_deadline_ms] if page.next_deadline_ms is not None else []
        else:
            deadlines = [lease.deadline_ms for lease in snapshot.leases if lease.name in view.nodes]
        self.next_expiry = (
            self._clock() + (min(deadlines) - snapshot.now_ms) / 1000 + 0.005 if deadlines else None
        )
        # A record read as garbage (or none) binds no generation: it is replaced, fenced by rev.
        garbage = snapshot.record_error is not None or view.record is None
        try:
            decision = plan(view, self._policy, self._memory)
        except IllegalTransition as exc:  # a record no leader writes: plan from none instead
            log.error("cannot plan from the job record in Redis (%s); rewriting it", exc)
            decision = plan(replace(view, record=None), self._policy, self._memory)
            garbage = True
        before, self._memory = self._memory, decision.memory
        # While a member lists ranks silent past their step times, the reports are read again
        # soon: the others' lists come in one by one, and no event brings them (job/stalls.py).
        listing = stalls.listing(view.nodes)
        self.next_poll = self._clock() + stalls.POLL_S if listing else None
        self._observe(snapshot, decision.held - before.held)  # held out: noticed now
        if snapshot.stale_head is not None and not decision.writes and view.record is not None:
            # What the others read of the record is not the record: write it again (COMMIT
            # writes its head and, for members it has not written, the ranks).
            decision = replace(decision, record=view.record)
        if decision.reason != self._last_reason:
            log.info("leader: %s", decision.reason)
            self._last_reason = decision.reason
        # The copies go by what the plan counted: not to a node held out as lost, and never of
        # a save on an abandoned timeline.
        nodes = decision.nodes
        if not decision.writes:
            self._handouts.lead(token, view.record, nodes)
            return Led()

        def write() -> int:
            return self._store.commit(token, snapshot.rev, decision, replacing_garbage=garbage)

        try:
            rev = self._call(write, "leader write")
        except FencedError as exc:
            log.info("leader write refused, re-reading: %s", exc)
            return Led(again=True)
        except CoordinationError as exc:
            log.warning("leader write failed: %s", exc)
            self._metrics.sync_failed()
            return Led()
        # a lapsed lease, unless held out before (noticed then)
        self._observe(snapshot, frozenset(decision.reap) - before.held)
        # Right after the record: a generation's fetches are there when its nodes read it.
        self._handouts.lead(token, decision.record or view.record, nodes)
        return Led(record=decision.record, rev=rev, again=True)

    def _observe(self, snapshot: Snapshot, names: frozenset[str]) -> None:
        """How long each of `names` went unnoticed: from its last heartbeat, in server time."""
        for lease in snapshot.leases:
            if lease.name in names:  # last heartbeat -> noticed, in server time
                lost_for = snapshot.now_ms - (lease.deadline_ms - self._lease_ttl_ms)
                self._metrics.detected("node_lost", lost_for / 1000)
