"""The agent's loop: observe (supervisor, Redis), decide (decide.py, plan.py), act.

This is the only place that executes decisions. Each tick:
1. reap worker exits (turned into events), act on what the node's own watches found
   (watchduties.py);
2. sync with Redis (heartbeat.py): publish this node's report, renew the lease, read the job
   record (and, as leader, the whole cluster);
3. run decide() and execute its actions;
4. as leader, run plan() and commit the result, fenced by the leader token (leaderduties.py).
A tick runs on every wake-up (stream entry, worker exit, signal) and at least every heartbeat.
How the agent leaves its job (a stop asked, a single job's end, the LEAVE) is leaving.py's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TypeVar

from nodeagent.checkpoint.keeper import TierKeeper
from nodeagent.checkpoint.replicas import Replicas
from nodeagent.config.settings import Config
from nodeagent.coord.bounded import BoundedCalls
from nodeagent.coord.store import Snapshot
from nodeagent.gpu.health import NodeHealth
from nodeagent.job import events as worker_events
from nodeagent.job.checkpoints.tierduties import tier_duties
from nodeagent.job.decide import (
    Acknowledge,
    Leave,
    LocalView,
    NodeDecision,
    ReleaseWorkers,
    SignalWorkers,
    StartWorkers,
    StopWorkers,
    decide,
    fenced_at,
)
from nodeagent.job.heartbeat import Heartbeat
from nodeagent.job.leaderduties import LeaderDuties
from nodeagent.job.lease import LeaseClock
from nodeagent.job.leaving import Leaving
from nodeagent.job.peers import PeerDuties, Watch
from nodeagent.job.port import JobPort, WorkerGroup
from nodeagent.job.progress import Progress
from nodeagent.job.ridethrough import FRESH_BEATS
from nodeagent.job.riding import Riding
from nodeagent.job.watchduties import WatchDuties
from nodeagent.model.job import Cordon, Event, JobRecord, NodeReport
from nodeagent.state import NODE_TRANSITIONS, NodeState, check_transition
from nodeagent.supervisor.fence import JobFence, Keeper
from nodeagent.supervisor.spec import pick_free_port, worker_specs
from nodeagent.supervisor.status import GroupPhase, GroupStatus
from nodeagent.telemetry.logs import LogContext
from nodeagent.telemetry.metrics import AgentMetrics
from nodeagent.telemetry.sdnotify import Notifier

log = logging.getLogger(__name__)
T = TypeVar("T")
SETTLE_POLL_S = 0.05  # how often the loop looks whether the checkpoint tiers have settled


@dataclass(frozen=True)
class AgentParts:
    """What a job's agent is handed beside its config, the job's state and its workers
    (runtime/jobrun.py; a test leaves out what it does not need). `tiers`: the job's checkpoint
    tiers on this node (job.checkpoint), prepared; `replicas`: its replica area
    (job.checkpoint.replicas), prepared: the agent listens on it; `peers`: its watch of the
    job's other members (timing.peer_interval), listening."""

    health: NodeHealth | None = None
    metrics: AgentMetrics | None = None
    log_context: LogContext | None = None
    notifier: Notifier | None = None
    keeper: Keeper | JobFence | None = None
    tiers: TierKeeper | None = None
    replicas: Replicas | None = None
    peers: Watch | None = None
    clock: Callable[[], float] = time.monotonic


class Agent:
    def __init__(
        self,
        config: Config,
        store: JobPort,
        workers: WorkerGroup,
        base_env: Mapping[str, str],
        parts: AgentParts = AgentParts(),
        until_done: bool = False,
    ) -> None:
        """`until_done`: serve this one job and leave when it ends (`nodeagent launch`, an
        embedded Redis; job/leaving.py). Otherwise a daemon: run until stopped."""
        self.config = config
        self.name = config.node.name
        self.state = NodeState.JOINING
        self.record: JobRecord | None = None
        self._workers = workers
        self._base_env = base_env
        self._clock = clock = parts.clock
        self._log = log
        self.log_context = parts.log_context or LogContext(self.name, config.job.id)
        self._rev = 0
        self._acked = 0
        self._fenced_generation: int | None = None
        self._signalled = "0-0"  # the last record signal sent to this node's workers
        self._free_port = pick_free_port(config.node.address)
        self._placed = (0, 0, 0)  # its workers' generation, group rank and members (resume.py)
        self._events: list[Event] = [Event("node_joined", node=self.name, message="agent started")]
        timing = config.timing
        rides = timing.ride_through > 0 and parts.peers is not None
        self._lease = LeaseClock(
            timing.lease_ttl, parts.keeper, timing.heartbeat_interval / 2, rides
        )
        self._dirty = True
        self._progress = Progress(self.name)
        self._metrics = metrics = parts.metrics or AgentMetrics(config.job.id)
        self._calls = BoundedCalls(clock)
        self._heartbeat = Heartbeat(store, self._lease, self._call, clock, config.timing)
        self._watch = WatchDuties(config, parts.health, store, metrics, self._call)
        self._tiers = (
            tier_duties(
                config, parts.tiers, parts.replicas, store, self._call, metrics.checkpoints, clock
            )
            if parts.tiers
            else None
        )
        self._leading = LeaderDuties(config, store, metrics, clock, self._call)
        self._peers = (
            PeerDuties(parts.peers, self.name, store, self._call, config.timing.lease_ttl, clock)
            if parts.peers is not None
            else None
        )
        fresh = FRESH_BEATS * timing.peer_interval
        self._riding = Riding(
            self.name, self._peers, self._lease, timing.ride_through, metrics, fresh
        )
        self.metrics_address: str | None = None  # set once the metrics server listens
        self._last_tick = clock()
        self._notify = parts.notifier or Notifier(None)
        self._leaving = Leaving(config, store, self._call, clock, until_done)
        self._log.info("agent started (address %s)", config.node.address)

    # -- control, safe from signal handlers (flags only) -------------------------------------

    def request_stop(self) -> None:
        """First call: stop workers gracefully and leave. Second call: kill workers now."""
        self._leaving.ask()

    @property
    def left(self) -> bool:
        return self._leaving.left

    @property
    def outcome(self) -> int | None:
        """The job's exit code, once a single job ended."""
        return self._leaving.outcome

    def step(self) -> float:
        """One pass of the loop; the seconds until the next is due (0: at once). For a loop
        that drives this agent along with other work (nodeagent.runtime.nodeloop)."""
        if self._leaving.forced:
            self._workers.kill()
        self.tick()
        if self._leaving.left:
            return 0.0
        self._leaving.observe(self.record)
        return 0.0 if self._dirty else self._next_wakeup() - self._clock()

    def _status_line(self) -> str:
        record = self.record
        job = (
            f"job {record.state.value}, generation {record.generation}" if record else "no job yet"
        )
        return f"{self.state.value}; {job}{' (leader)' if self.leading else ''}"

    def note(self, event: Event) -> None:
        """An event of this node's that the agent did not see itself (its image's pull), sent
        with the next sync."""
        self._events.append(event)

    def healthz(self) -> tuple[bool, str]:
        """For /healthz: the loop ticks and the lease is being renewed. Any thread."""
        generation = self.record.generation if self.record else 0
        return self._heartbeat.healthz(
            self._last_tick, f"ok: {self.state.value}, generation {generation}"
        )

    def tick(self) -> None:
        now = self._last_tick = self._clock()
        self._leaving.tick(now)
        self._ride(now)
        if self._fence_due(now) and self._fenced_generation is None:
            # The loop ran late (the agent was frozen, the machine starved it): the lease may be
            # lapsing and the keeper may have acted. Fence before reaping, so that these exits
            # count as fenced, not as failures, whatever the next sync says.
            self._apply(decide(self._local_view(now)), now)
        for ended in self._workers.poll():
            self._events.append(worker_events.exited(self.name, ended))
            if ended.failed:
                self._metrics.worker_failed("signal" if ended.signal else "exit_code")
        found = self._watch.check(now, self._workers)
        self._events += found.events
        if found.anything:
            self._dirty = True
        if self._tiers is not None:
            self._events += self._tiers.tick(self._workers.status(), self.record, self._drained)
        self._events += self._progress.tick(
            now,
            self._workers.status(),
            self.record.group_rank(self.name) if self.record is not None else None,
            self._watch.watchers.stretch(0),
            self._tiers.newest_save if self._tiers is not None else None,
        )
        self._watch.measure(now, self._workers)
        if self._peers is not None:
            suspected = self._peers.tick(self.record)
            self._events += suspected
            new = sum(len(e.data.get("new", ())) for e in suspected)
            self._metrics.peers(len(self._peers.suspects), new)
        self._dirty = False
        snapshot = self._sync() if self._heartbeat.due(now) else None
        if self._deposes(snapshot):  # it leads from its next heartbeat
            self._dirty = True
        named = self._watch.named(self.record, self._workers) if snapshot is not None else None
        if named is not None:
            self._events += named.events
        now = self._clock()  # the sync may have used its whole budget: decide on a fresh clock
        self._ride(now)  # (a ride may begin only now: the fence point passed during the sync)
        self._apply(decide(self._local_view(now)), now)
        self._guard()
        self._metrics.worker_states(self._workers.workers())
        # STOPPING=1 only where this job's end is the daemon's (`nodeagent launch`). A pool
        # node's loop says it itself when the daemon stops: a job's agent leaving its job said
        # it too, and systemd, taking the whole service for stopping, SIGKILLed the agent and
        # the next job's workers TimeoutStopSec later (found on booted nodes, tests/booted).
        self._notify.report(self._status_line(), self._leaving.ends_daemon)
        self._metrics.beats(self._watch.watchers.last_progress())
        # A leader shutting down leads until it leaves (LEAVE gives the lease up at once): it
        # announces the generation that goes on without it, so that it hands its stop save
        # over first, as any member leaving does (else nobody announced before it had left,
        # and the new world went back to the committed step; found on the booted nodes).
        if snapshot is not None and self.leading:
            self._lead(snapshot)
        elif not self.leading:
            self._leading.stepped_down()

    def _ride(self, now: float) -> None:
        """Past its fence point without a renewal: ride through, or not (job/riding.py)."""
        group = self._workers.status()
        if self._fenced_generation is not None:  # nothing to ride: its beats say so
            group = replace(group, phase=GroupPhase.STOPPING) if group.active else group
        cut_off = self._heartbeat.last_error is not None
        events, began = self._riding.tick(now, self.record, group, self._acked, cut_off)
        self._events += events
        if began:  # before the keeper acts on the lease's own times
            self._guard()
            self._dirty = True

    def critical_at(self) -> float | None:
        """When this job's lease next needs the node's loop, while its workers run on it: where
        a ride may begin, its fence point, or, riding, its next beat (None: no workers)."""
        if self._fenced_generation is not None or not self._workers.status().active:
            return None
        if self._lease.riding:
            return self._clock() + self.config.timing.peer_interval
        return self._lease.critical_at

    def _deposes(self, snapshot: Snapshot | None) -> bool:
        """Took the leader lease from a leader the members hold out (job/peers.py)."""
        if snapshot is None or self.leading or self._peers is None:
            return False
        return self._peers.depose(snapshot.leader)

    def _call(self, fn: Callable[[], T], what: str) -> T:
        """A Redis call bounded by the fence point (lease.LeaseClock.call_deadline)."""
        deadline = self._lease.call_deadline(self._clock(), self._fenced_generation is None)
        return self._calls.run(fn, deadline, what)

    def _guard(self) -> None:
        """Keep the fence keeper alive and told when to fence the running worker groups."""
        if not self._lease.guard(self._workers.groups()):
            self._dirty = True  # it cannot run: fence now

    # -- observe -----------------------------------------------------------------------------

    def _report(self) -> NodeReport:
        group = self._workers.status()
        record = self.record
        generation, rank, size = self._placed
        placed = group.active and group.generation == generation
        return NodeReport(
            name=self.name,
            address=self.config.node.address,
            state=self.state,
            acked_generation=self._acked,
            worker_generation=group.generation,
            group_rank=rank if placed else None,
            group_size=size if placed else 0,
            free_port=self._free_port,
            restart_count=record.restart_count if record else 0,
            lease_ttl_ms=int(self.config.timing.lease_ttl * 1000),
            workers=self._workers.workers(),
            failure=group.failure,
            succeeded_generation=group.generation
            if group.succeeded and group.phase is GroupPhase.EXITED
            else None,
            last_error=self._heartbeat.last_error,
            metrics=self.metrics_address,
            cordon=self._watch.cordon,
            unfit=self._watch.watchers.unfit,
            gpu=self._watch.watchers.gpu_summary(),
            tier=self._tiers.report() if self._tiers is not None else None,
            watch_port=self._peers.port if self._peers is not None else 0,
            watch_token=self._peers.token if self._peers is not None else None,
            suspects=self._peers.suspects if self._peers is not None else (),
            warming=group.warming,
            stalls=self._watch.watchers.stalls,
            peers_out=self._peers.out(record.generation if record else self._acked)
            if self._peers is not None
            else (),
        )

    def _sync(self) -> Snapshot | None:
        events, self._events = self._events, []
        snapshot = self._heartbeat.send(self._report(), events)
        if snapshot is None:
            self._metrics.sync_failed()
            self._events = events + self._events
            self._leading.token = None
            return None
        now = self._heartbeat.sent_at
        self._events += self._riding.synced(self._clock())
        self.record = snapshot.record
        self._rev = snapshot.rev
        self.log_context.generation = snapshot.record.generation if snapshot.record else 0
        self._watch.synced(snapshot.cordon)
        self._leading.synced(snapshot)
        if not self.leading:
            self._heartbeat.follow_leader(snapshot)
        self._metrics.synced(self._clock() - now, snapshot.record, self.leading, now)
        self._notify.ready(self._status_line())  # joined Redis: the service has started
        return snapshot

    def _fence_due(self, now: float) -> bool:
        return self._lease.fence_due(now)

    @property
    def _drained(self) -> bool:
        """This node leaves the job's next generation of its own accord: it is drained, or its
        agent is shutting down (`systemctl stop`). Either way it hands the save its workers made
        as they stopped to its successors before it acknowledges (job/checkpoints/handover.py):
        else the new world, lacking its ranks of that step, went back to the committed one
        (found on the booted nodes: 6 steps lost to a `systemctl stop` on a member)."""
        return self.drained_from_job is not None or self._leaving.asked

    def _holds_back(self, group: GroupStatus) -> bool:
        """This node's tiers hold back its acknowledgement of the next generation."""
        assert self._tiers is not None
        held = self._tiers.holds_back(group, self.record, self._drained)
        hands_over = self._tiers.hands_over
        return held or self._leaving.awaiting_announcement(self.record, group, hands_over)

    def _local_view(self, now: float) -> LocalView:
        group = self._workers.status()
        return LocalView(
            name=self.name,
            acked_generation=self._acked,
            group=group,
            record=self.record,
            shutting_down=self._leaving.asked,
            fence=self._fence_due(now),
            fenced_generation=self._fenced_generation,
            cordon=self._watch.cordon,
            unfit=self._watch.watchers.unfit,
            in_place=self.config.job.in_place,
            warm_ups=self.config.job.warm_ups,
            tiers_settling=self._tiers is not None and self._holds_back(group),
            tiers_copying=self._tiers is not None and self._tiers.holds_start(self.record),
            signalled=self._signalled,
        )

    def _next_wakeup(self) -> float:
        deadlines = [
            self._heartbeat.next_due,
            self._workers.next_deadline(),
            self._leading.next_due(),
            self._peers.next_due if self._peers is not None else None,
            self._notify.next_ping(),
            self._watch.next_due(),
        ]
        if self._tiers is not None and (
            self._holds_back(self._workers.status()) or self._tiers.awaiting_share
        ):
            deadlines.append(self._clock() + SETTLE_POLL_S)
        lease, now = self._lease, self._clock()
        if lease.fence_point is not None and self._fenced_generation is None:
            deadlines.append(lease.fence_point)
            if (begins := lease.critical_at) is not None and begins > now:
                deadlines.append(begins)  # where a ride may begin
        if lease.riding:  # its peers are judged at every beat
            deadlines.append(now + self.config.timing.peer_interval)
        return min(at for at in deadlines if at is not None)

    # -- act ---------------------------------------------------------------------------------

    def _apply(self, decision: NodeDecision, now: float) -> None:
        if decision.state is not self.state:
            check_transition(NODE_TRANSITIONS, self.state, decision.state)
            self._log.info("%s -> %s: %s", self.state.value, decision.state.value, decision.reason)
            self.state = decision.state
            self._metrics.state(decision.state)
            self._dirty = True
            if decision.state in _ANNOUNCED:  # the leader must act on these at once: wake it
                self._events.append(
                    Event(_ANNOUNCED[decision.state], node=self.name, message=decision.reason)
                )
        if decision.state is NodeState.FENCED and self._fenced_generation is None:
            group_gen = self._workers.status().generation or 0
            self._fenced_generation = fenced_at(self._acked, group_gen, self.record)
            self._leading.token = None
        for action in decision.actions:
            self._dirty = True
            if isinstance(action, StopWorkers):
                self._stop_workers(action, now)
            elif isinstance(action, ReleaseWorkers):
                self._release_workers(action)
            elif isinstance(action, Acknowledge):
                self._acknowledge(action.generation)
            elif isinstance(action, StartWorkers):
                self._start_workers(action)
            elif isinstance(action, Leave):
                self._leaving.leave()
            elif isinstance(action, SignalWorkers):
                self._log.info("sending SIG%s to the workers (%s)", action.signal, action.id)
                self._workers.signal(action.signal)
                self._signalled = action.id

    def _stop_workers(self, action: StopWorkers, now: float) -> None:
        timing = self.config.timing
        grace = timing.failure_stop_grace_period if action.broken else timing.stop_grace_period
        kill_at = self._lease.kill_at
        if action.fence and kill_at is not None:
            grace = max(0.0, min(grace, kill_at - self._clock()))
        if self._tiers is not None:
            self._tiers.stopping(action.broken, action.fence)
        self._log.info("stopping workers (%s), grace %.1fs", action.reason, grace)
        self._workers.stop(grace)

    def _release_workers(self, action: ReleaseWorkers) -> None:
        timeout = self.config.timing.reform_timeout
        if self._tiers is not None:  # their last saves persist unless the generation failed
            self._tiers.stopping(action.broken, fence=False)
        self._log.info(
            "workers leave their generation in place (%s), within %gs", action.reason, timeout
        )
        self._workers.release(timeout)

    def _acknowledge(self, generation: int) -> None:
        self._acked = generation
        if self._fenced_generation is not None and generation > self._fenced_generation:
            self._fenced_generation = None
        self._free_port = pick_free_port(self.config.node.address)
        self._events.append(
            Event("node_ready", generation=generation, node=self.name, message="no workers running")
        )

    def _start_workers(self, action: StartWorkers) -> None:
        record = action.record
        watch = self._watch.watchers
        specs = worker_specs(
            self._base_env,
            self.config,
            record,
            action.group_rank,
            watch.usable_gpus,
        )
        self._log.info(
            "starting %d workers: ranks %d-%d of %s, master %s:%d",
            len(specs),
            specs[0].rank,
            specs[-1].rank,
            specs[0].env.get("WORLD_SIZE"),  # what the workers get: members x local nproc
            record.master_addr,
            record.master_port,
        )
        if self._tiers is not None:
            self._tiers.started(record, specs, self.config.log_dir)
        started = self._workers.start(record.generation, self.name, specs)
        self._placed = (record.generation, action.group_rank, len(record.members))
        self._metrics.workers_started(record.generation, self._clock())
        watch.started(started.specs, self._clock())
        ranks = [spec.rank for spec in specs]
        self._events.append(worker_events.started(self.name, record.generation, ranks, started))

    @property
    def drained_from_job(self) -> Cordon | None:
        """This node's cordon in the job when it drains it (an operator's, the slow-node
        policy's): the job goes on without this node."""
        return self._watch.drained_from_job

    @property
    def leading(self) -> bool:
        """This agent held the leader lease at its last sync."""
        return self._leading.token is not None

    def _lead(self, snapshot: Snapshot) -> None:
        led, events = self._leading.lead(snapshot, self.record)
        if led.rev is not None:
            self._rev = led.rev
        if led.record is not None:
            self.record = led.record
            self.log_context.generation = led.record.generation
        if led.again:
            self._dirty = True
        self._events += events


_ANNOUNCED = {NodeState.LEAVING: "node_leaving", NodeState.FENCED: "node_fenced"}
