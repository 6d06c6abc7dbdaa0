"""This node's ride through a Redis outage (job/ridethrough.py decides; this acts on it).

At every tick its beats are told what its workers are doing. Past its fence point, with no
renewal, the pure rule says whether it may train on: if so the lease's fence point (and the
keeper's times, told at once) moves to the ride's end, and the ride is followed at every tick
after, its peers' beats waking the loop; the moment the rule no longer holds the fence point
moves back to now and the agent fences itself as before. A renewal ends the ride: the
generation goes on. Each is said once, in the log and as an event.
"""

from __future__ import annotations

import logging

from nodeagent.job.lease import LeaseClock
from nodeagent.job.peers import PeerDuties
from nodeagent.job.ridethrough import Ride, RideView, ride, says
from nodeagent.model.job import Event, JobRecord
from nodeagent.supervisor.status import GroupStatus
from nodeagent.telemetry.metrics import AgentMetrics

log = logging.getLogger(__name__)


class Riding:
    def __init__(
        self,
        name: str,
        peers: PeerDuties | None,
        lease: LeaseClock,
        ride_through: float,
        metrics: AgentMetrics,
        fresh_s: float = 0.5,
    ) -> None:
        """`fresh_s`: how recent every peer's last beat must be for a ride to begin and go on
        (a partition of this node only shows as its peers' silence: judged at once, not at
        the watch's own suspicion, which may take up to peer_timeout)."""
        self._name, self._peers, self._lease = name, peers, lease
        self._ride_through, self._metrics, self._fresh_s = ride_through, metrics, fresh_s
        self._began: tuple[float, int] | None = None  # when the ride began, and its generation
        self._refused = ""  # why it last could not ride (said once)

    def tick(
        self,
        now: float,
        record: JobRecord | None,
        group: GroupStatus,
        acked: int,
        cut_off: bool,
    ) -> tuple[list[Event], bool]:
        """Tell the beats, and begin, follow or cut short a ride (`cut_off`: its last sync
        failed): the events to send, and whether a ride began now (the keeper must be told at
        once)."""
        peers, lease = self._peers, self._lease
        if peers is not None:
            peers.tell(says(group, acked, lease.riding))
        if peers is None or self._ride_through <= 0:
            return [], False
        if lease.riding and not lease.may_ride(now):  # it ran late: the keeper may have acted
            return self._cut(now, "its fence keeper may have acted: the agent ran late"), False
        if not lease.may_ride(now) or not (cut_off or lease.riding):
            return [], False
        watched = peers.watched(record) if record is not None else ()
        if watched is None:
            verdict = Ride(False, None, "its members were not read for this generation")
        else:
            near = record.generation if record is not None else acked
            verdict = ride(
                RideView(
                    me=self._name,
                    now=now,
                    renewed_at=lease.last_ok_send or now,
                    ride_through=self._ride_through,
                    record=record,
                    group=group,
                    watched=watched,
                    heard=peers.heard(near, self._fresh_s),
                )
            )
        if verdict.on and verdict.until is not None:
            began = not lease.riding
            lease.ride(verdict.until, now)
            if not began:
                return [], False
            assert record is not None
            self._began, self._refused = (now, record.generation), ""
            self._metrics.ride(True)
            left = verdict.until - now
            message = f"cannot reach Redis: riding through for up to {left:.1f}s ({verdict.reason})"
            log.warning("%s", message)
            return [self._event("node_riding", record.generation, message)], True
        if lease.riding:
            return self._cut(now, verdict.reason, verdict.unheard), False
        if verdict.reason != self._refused:
            self._refused = verdict.reason
            log.warning("cannot reach Redis and cannot ride through: %s", verdict.reason)
        return [], False

    def _cut(self, now: float, why: str, unheard: bool = False) -> list[Event]:
        self._lease.cut(now, unheard)
        generation = self._began[1] if self._began else None
        self._began = None
        self._metrics.ride(False, "fenced")
        message = f"ride through ended, fencing: {why}"
        log.warning("%s", message)
        return [self._event("node_ride_ended", generation, message)]

    def synced(self, now: float) -> list[Event]:
        """Redis reached again (the lease renewed, which ended any ride)."""
        began, self._began = self._began, None
        if began is None:
            return []
        self._metrics.ride(False, "resumed")
        message = f"Redis reachable again after riding through {now - began[0]:.1f}s"
        log.info("%s: generation %d goes on", message, began[1])
        return [self._event("node_rode_through", began[1], message)]

    def _event(self, kind: str, generation: int | None, message: str) -> Event:
        return Event(kind, generation=generation, node=self._name, message=message)
