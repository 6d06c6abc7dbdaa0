"""The agent's heartbeat: one SYNC with the job's state (job/port.py) sends this node's report
and events, renews its lease (job/lease.py, counted from when the call was sent) and reads the
record back. The next is due a heartbeat_interval later, sooner when the leader's lease lapses
first (a dead leader is replaced then, not up to a heartbeat later), half an interval after one
that failed; a failure is said once and kept for /healthz and the node's report.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from nodeagent.config.settings import TimingConfig
from nodeagent.coord.bounded import CallRunner
from nodeagent.coord.store import Snapshot
from nodeagent.errors import CoordinationError
from nodeagent.job.lease import LeaseClock
from nodeagent.job.port import JobPort
from nodeagent.model.job import Event, NodeReport

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(
        self,
        store: JobPort,
        lease: LeaseClock,
        call: CallRunner,
        clock: Callable[[], float],
        timing: TimingConfig,
    ) -> None:
        self._store, self._lease, self._call, self._clock = store, lease, call, clock
        self._timing = timing
        self.last_error: str | None = None  # why the last sync failed; None once one worked
        self.sent_at = 0.0  # when the last sync that worked was sent
        self._retry_at = 0.0
        self._next_sync = 0.0

    def due(self, now: float) -> bool:
        """Not waiting to retry a failed sync (a tick syncs whenever it runs but then)."""
        return now >= self._retry_at

    @property
    def next_due(self) -> float:
        return self._next_sync if self.last_error is None else self._retry_at

    def send(self, report: NodeReport, events: Sequence[Event]) -> Snapshot | None:
        """One sync; None when the job's state cannot be reached (retried in half a beat)."""
        now = self._clock()  # when the call is sent: the lease lasts at least lease_ttl from here
        try:
            snapshot = self._call(lambda: self._store.sync(report, events), "heartbeat")
        except CoordinationError as exc:
            self._retry_at = self._clock() + self._timing.heartbeat_interval / 2
            if self.last_error is None:  # said once an outage, not at every retry
                log.warning("cannot reach Redis: %s", exc)
            self.last_error = str(exc)
            return None
        self._lease.renewed(now)
        self.sent_at = now
        self._next_sync = now + self._timing.heartbeat_interval
        if self.last_error is not None:
            log.info("Redis reachable again")
            self.last_error = None
        return snapshot

    def follow_leader(self, snapshot: Snapshot) -> None:
        """A follower syncs when the leader's lease lapses: a dead leader is replaced then, not
        up to a heartbeat later."""
        if snapshot.leader_deadline_ms is None:
            return
        now = self.sent_at
        lapse = now + (snapshot.leader_deadline_ms - snapshot.now_ms) / 1000 + 0.005
        self._next_sync = min(self._next_sync, max(lapse, now + 0.01))

    def healthz(self, last_tick: float, ok: str) -> tuple[bool, str]:
        """For /healthz: the loop ticks (it last did at `last_tick`) and the lease is being
        renewed; `ok` says so. Any thread."""
        now = self._clock()
        stalled = now - last_tick
        if stalled > max(5 * self._timing.heartbeat_interval, 5.0):
            return False, f"agent loop stalled for {stalled:.1f}s"
        last = self._lease.last_ok_send
        if last is None:
            return False, f"not connected to Redis yet: {self.last_error or 'starting'}"
        if now - last > self._timing.lease_ttl:
            return False, f"no lease renewal for {now - last:.1f}s: {self.last_error}"
        return True, ok
