"""This node's part as the job's leader, as the agent runs it: it leads while its last sync says
it holds the leader lease (and wakes its stream listener when it takes it, so that it watches
the job's events and commands from then on: runtime/jobrun.py); while it leads it plans and
commits (job/leadership.py) and runs the slow-node watch (job/slowwatch.py); when it does not,
both step down.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from nodeagent.config.settings import Config
from nodeagent.coord.bounded import CallRunner
from nodeagent.coord.store import Snapshot
from nodeagent.errors import CoordinationError
from nodeagent.job.leadership import Leadership, Led
from nodeagent.job.plan import policy_from
from nodeagent.job.port import JobPort
from nodeagent.job.slowwatch import SlowWatch, slow_policy
from nodeagent.model.job import Event, JobRecord
from nodeagent.telemetry.metrics import AgentMetrics

log = logging.getLogger(__name__)


class LeaderDuties:
    def __init__(
        self,
        config: Config,
        store: JobPort,
        metrics: AgentMetrics,
        clock: Callable[[], float],
        call: CallRunner,
    ) -> None:
        self._name, self._store, self._call = config.node.name, store, call
        ttl = config.timing.lease_ttl
        self._leadership = Leadership(store, policy_from(config), metrics, ttl, clock, call)
        self._slow = SlowWatch(store, slow_policy(config), metrics, clock, call)
        self.token: str | None = None  # the leader lease's, while this node holds it

    def synced(self, snapshot: Snapshot) -> None:
        """Whether this node holds the leader lease, as its sync read it."""
        leader = snapshot.leader if snapshot.leader_name == self._name else None
        if leader != self.token:
            log.info("leadership %s", "acquired" if leader else f"held by {snapshot.leader_name}")
        acquired = leader is not None and self.token is None
        self.token = leader
        if acquired:  # now its stream listener must watch the events too (runtime/jobrun.py)
            self._wake_listeners()

    def lead(self, snapshot: Snapshot, record: JobRecord | None) -> tuple[Led, list[Event]]:
        """Plan and commit from `snapshot` (this node's `record` as it read it), account the
        job's goodput, and run the slow-node watch: what was led, and the watch's events."""
        assert self.token is not None
        led = self._leadership.lead(self.token, snapshot)
        current = led.record or record
        self._leadership.account(snapshot.now_ms, current.generation if current else 0)
        # the record as stored, whole: a node's own record names only its own place
        stored = led.record or snapshot.stored_record
        events = self._slow.tick(
            self.token, stored, lambda: snapshot.cluster_view().nodes, snapshot.now_ms
        )
        return led, events

    def stepped_down(self) -> None:
        self._leadership.stepped_down()
        self._slow.stepped_down()

    def next_due(self) -> float | None:
        """While it leads: when a member's lease lapses, the slow-node watch judges, or the
        members' lists of stalled ranks are read again (job/stalls.py)."""
        if self.token is None:
            return None
        due = [self._leadership.next_expiry, self._slow.next_due(), self._leadership.next_poll]
        return min((at for at in due if at is not None), default=None)

    def _wake_listeners(self) -> None:
        """An entry on the wake stream: this agent's listener, blocked on that stream alone
        while it followed, returns and watches the events and commands from now on."""
        try:
            self._call(lambda: self._store.wake(f"leader {self._name}"), "wake")
        except CoordinationError as exc:  # it still ticks every heartbeat
            log.info("could not wake the stream listener: %s", exc)
