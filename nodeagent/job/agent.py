"""The agent's loop: observe (supervisor, Redis), decide (decide.py, plan.py), act.

This is the only place that executes decisions. Each tick:
1. reap worker exits (turned into events);
2. sync with Redis: publish this node's report, renew the lease, read the job record
   (and, as leader, the whole cluster);
3. run decide() and execute its actions;
4. as leader, run plan() and commit the result, fenced by the leader token.
A tick runs on every wake-up (stream entry, worker exit, signal) and at least every heartbeat.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

from nodeagent.checkpoint.keeper import TierKeeper
from nodeagent.checkpoint.replicas import Replicas
from nodeagent.config.settings import Config
from nodeagent.coord.bounded import BoundedCalls
from nodeagent.coord.store import Snapshot
from nodeagent.errors import CoordinationError
from nodeagent.gpu.health import NodeHealth
from nodeagent.job import events as worker_events
from nodeagent.job import outcome
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
from nodeagent.job.leadership import Leadership
from nodeagent.job.lease import LeaseClock
from nodeagent.job.peers import PeerDuties
from nodeagent.job.peerwatch import PeerWatch
from nodeagent.job.plan import policy_from
from nodeagent.job.port import JobPort
from nodeagent.job.progress import Progress
from nodeagent.job.slowwatch import SlowWatch, slow_policy
from nodeagent.job.speed import SpeedWatch
from nodeagent.job.watch import WorkerWatch
from nodeagent.model.job import Cordon, Event, JobRecord, NodeReport, WorkerInfo
from nodeagent.state import NODE_TRANSITIONS, JobState, NodeState, check_transition
from nodeagent.supervisor.fence import Group, Keeper
from nodeagent.supervisor.spec import WorkerSpec, pick_free_port, worker_specs
from nodeagent.supervisor.status import GroupPhase, GroupStatus, Started, WorkerExit
from nodeagent.telemetry.logs import LogContext
from nodeagent.telemetry.metrics import AgentMetrics
from nodeagent.telemetry.sdnotify import Notifier

log = logging.getLogger(__name__)
T = TypeVar("T")
SETTLE_POLL_S = 0.05  # how often the loop looks whether the checkpoint tiers have settled


class WorkerGroup(Protocol):
    """What the agent needs from the supervisor (a seam for tests)."""

    def start(self, generation: int, node: str, specs: list[WorkerSpec]) -> Started: ...
    def release(self, timeout_s: float) -> None: ...
    def stop(self, grace_s: float) -> None: ...
    def kill(self) -> None: ...
    def poll(self) -> list[WorkerExit]: ...
    def mark_failed(self, local_rank: int, kind: str, code: int | None = None) -> None: ...
    def dump_stacks(self, local_rank: int) -> str: ...
    def signal(self, name: str) -> None: ...
    def status(self) -> GroupStatus: ...
    def next_deadline(self) -> float | None: ...
    def workers(self) -> tuple[WorkerInfo, ...]: ...
    def groups(self) -> tuple[Group, ...]: ...


class Agent:
    def __init__(
        self,
        config: Config,
        store: JobPort,
        workers: WorkerGroup,
        base_env: Mapping[str, str],
        health: NodeHealth | None = None,
        metrics: AgentMetrics | None = None,
        log_context: LogContext | None = None,
        notifier: Notifier | None = None,
        keeper: Keeper | None = None,
        clock: Callable[[], float] = time.monotonic,
        until_done: bool = False,
        tiers: TierKeeper | None = None,
        replicas: Replicas | None = None,
        peers: PeerWatch | None = None,
    ) -> None:
        """`until_done`: serve this one job and leave when it ends (`nodeagent launch`, an
        embedded Redis); `outcome` is then its exit code. Otherwise a daemon: run until stopped.
        `tiers`: the job's checkpoint tiers on this node (job.checkpoint), prepared; `replicas`:
        its replica area (job.checkpoint.replicas), prepared: the agent listens on it. `peers`:
        its watch of the job's other members (timing.peer_interval), listening."""
        self.config = config
        self.name = config.node.name
        self.state = NodeState.JOINING
        self.record: JobRecord | None = None
        self._store = store
        self._workers = workers
        self._base_env = base_env
        self._clock = clock
        self._log = log
        self.log_context = log_context or LogContext(self.name, config.job.id)
        self._leader: str | None = None
        self._rev = 0
        self._acked = 0
        self._fenced_generation: int | None = None
        self._signalled = "0-0"  # the last record signal sent to this node's workers
        self._free_port = pick_free_port(config.node.address)
        self._events: list[Event] = [Event("node_joined", node=self.name, message="agent started")]
        self._lease = LeaseClock(config.timing.lease_ttl, keeper)
        self._retry_at = 0.0
        self._next_sync = 0.0
        self._dirty = True
        self._shutting_down = False
        self._shutdown_began: float | None = None  # when a tick first saw it
        self._force = False
        self._left = False
        self._last_error: str | None = None
        self._watchers = WorkerWatch(self.name, config.timing.hang_timeout, health)
        self._progress = Progress(self.name)
        self._metrics = metrics or AgentMetrics(config.job.id)
        self._calls = BoundedCalls(clock)
        self._tiers = (
            tier_duties(
                config, tiers, replicas, store, self._call, self._metrics.checkpoints, clock
            )
            if tiers
            else None
        )
        self._leadership = Leadership(
            store, policy_from(config), self._metrics, config.timing.lease_ttl, clock, self._call
        )
        self._peers = (
            PeerDuties(peers, self.name, store, self._call, config.timing.lease_ttl, clock)
            if peers is not None
            else None
        )
        window = config.job.slow_node.window
        self._speed = SpeedWatch(self.name, window) if window > 0 else None
        self._slow = SlowWatch(store, slow_policy(config), self._metrics, clock, self._call)
        self.metrics_address: str | None = None  # set once the metrics server listens
        self._last_tick = clock()
        self._notify = notifier or Notifier(None)
        self._cordon: Cordon | None = None
        self._single = outcome.SingleJob(config.job.id) if until_done else None
        self.outcome: int | None = None  # the job's exit code, once a single job ended
        self._log.info("agent started (address %s)", config.node.address)

    # -- control, safe from signal handlers (flags only) -------------------------------------

    def request_stop(self) -> None:
        """First call: stop workers gracefully and leave. Second call: kill workers now."""
        if self._shutting_down:
            self._force = True
        self._shutting_down = True

    @property
    def left(self) -> bool:
        return self._left

    def step(self) -> float:
        """One pass of the loop; the seconds until the next is due (0: at once). For a loop
        that drives this agent along with other work (nodeagent.runtime.nodeloop)."""
        if self._force:
            self._workers.kill()
        self.tick()
        if self._left:
            return 0.0
        self._end_with_job()
        return 0.0 if self._dirty else self._next_wakeup() - self._clock()

    def _end_with_job(self) -> None:
        if self._single is None or self._shutting_down:
            return
        ending = self._single.observe(self.record)
        if ending is None:
            return
        self.outcome = ending.code
        self._log.log(logging.ERROR if ending.error else logging.INFO, "%s", ending.message)
        self.request_stop()

    def _status_line(self) -> str:
        record = self.record
        job = (
            f"job {record.state.value}, generation {record.generation}" if record else "no job yet"
        )
        return f"{self.state.value}; {job}{' (leader)' if self._leader else ''}"

    def note(self, event: Event) -> None:
        """An event of this node's that the agent did not see itself (its image's pull), sent
        with the next sync."""
        self._events.append(event)

    def healthz(self) -> tuple[bool, str]:
        """For /healthz: the loop ticks and the lease is being renewed. Any thread."""
        now, timing = self._clock(), self.config.timing
        stalled = now - self._last_tick
        if stalled > max(5 * timing.heartbeat_interval, 5.0):
            return False, f"agent loop stalled for {stalled:.1f}s"
        last = self._lease.last_ok_send
        if last is None:
            return False, f"not connected to Redis yet: {self._last_error or 'starting'}"
        if now - last > timing.lease_ttl:
            return False, f"no lease renewal for {now - last:.1f}s: {self._last_error}"
        return (
            True,
            f"ok: {self.state.value}, generation {self.record.generation if self.record else 0}",
        )

    def tick(self) -> None:
        now = self._last_tick = self._clock()
        if self._shutting_down and self._shutdown_began is None:
            self._shutdown_began = now
        if self._fence_due(now) and self._fenced_generation is None:
            # The loop ran late (the agent was frozen, the machine starved it): the lease may be
            # lapsing and the keeper may have acted. Fence before reaping, so that these exits
            # count as fenced, not as failures, whatever the next sync says.
            self._apply(decide(self._local_view(now)), now)
        for ended in self._workers.poll():
            self._events.append(worker_events.exited(self.name, ended))
            if ended.failed:
                self._metrics.worker_failed("signal" if ended.signal else "exit_code")
        self._watch(now)
        if self._tiers is not None:
            self._events += self._tiers.tick(self._workers.status(), self.record, self._drained)
        self._events += self._progress.tick(
            now,
            self._workers.status(),
            self.record.group_rank(self.name) if self.record is not None else None,
            self._watchers.stretch(0),
            self._tiers.newest_save if self._tiers is not None else None,
        )
        self._measure_speed(now)
        if self._peers is not None:
            suspected = self._peers.tick(self.record)
            self._events += suspected
            new = sum(len(e.data.get("new", ())) for e in suspected)
            self._metrics.peers(len(self._peers.suspects), new)
        self._dirty = False
        snapshot = self._sync(now) if now >= self._retry_at else None
        if self._deposes(snapshot):  # it leads from its next heartbeat
            self._dirty = True
        now = self._clock()  # the sync may have used its whole budget: decide on a fresh clock
        self._apply(decide(self._local_view(now)), now)
        self._guard()
        self._metrics.worker_states(self._workers.workers())
        # STOPPING=1 only where this job's end is the daemon's (`nodeagent launch`). A pool
        # node's loop says it itself when the daemon stops: a job's agent leaving its job said
        # it too, and systemd, taking the whole service for stopping, SIGKILLed the agent and
        # the next job's workers TimeoutStopSec later (found on booted nodes, tests/booted).
        self._notify.report(self._status_line(), self._shutting_down and self._single is not None)
        self._metrics.beats(self._watchers.last_progress())
        # A leader shutting down leads until it leaves (LEAVE gives the lease up at once): it
        # announces the generation that goes on without it, so that it hands its stop save
        # over first, as any member leaving does (else nobody announced before it had left,
        # and the new world went back to the committed step; found on the booted nodes).
        if snapshot is not None and self._leader is not None:
            self._lead(snapshot)
        elif self._leader is None:
            self._leadership.stepped_down()
            self._slow.stepped_down()

    def _deposes(self, snapshot: Snapshot | None) -> bool:
        """Took the leader lease from a leader the members hold out (job/peers.py)."""
        if snapshot is None or self._leader is not None or self._peers is None:
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
        return NodeReport(
            name=self.name,
            address=self.config.node.address,
            state=self.state,
            acked_generation=self._acked,
            worker_generation=group.generation,
            group_rank=record.group_rank(self.name) if record and group.active else None,
            free_port=self._free_port,
            restart_count=record.restart_count if record else 0,
            lease_ttl_ms=int(self.config.timing.lease_ttl * 1000),
            workers=self._workers.workers(),
            failure=group.failure,
            succeeded_generation=group.generation
            if group.succeeded and group.phase is GroupPhase.EXITED
            else None,
            last_error=self._last_error,
            metrics=self.metrics_address,
            cordon=self._cordon,
            unfit=self._watchers.unfit,
            gpu=self._watchers.gpu_summary(),
            tier=self._tiers.report() if self._tiers is not None else None,
            watch_port=self._peers.port if self._peers is not None else 0,
            watch_token=self._peers.token if self._peers is not None else None,
            suspects=self._peers.suspects if self._peers is not None else (),
            warming=group.warming,
        )

    def _sync(self, now: float) -> Snapshot | None:
        events, self._events = self._events, []
        report = self._report()
        now = self._clock()  # when the call is sent: the lease lasts at least lease_ttl from here
        try:
            snapshot = self._call(lambda: self._store.sync(report, events), "heartbeat")
        except CoordinationError as exc:
            self._metrics.sync_failed()
            self._events = events + self._events
            self._retry_at = self._clock() + self.config.timing.heartbeat_interval / 2
            self._leader = None
            if self._last_error != str(exc):
                self._log.warning("cannot reach Redis: %s", exc)
            self._last_error = str(exc)
            return None
        self._lease.renewed(now)
        self._next_sync = now + self.config.timing.heartbeat_interval
        if self._last_error is not None:
            self._log.info("Redis reachable again")
            self._last_error = None
        self.record = snapshot.record
        self._rev = snapshot.rev
        self.log_context.generation = snapshot.record.generation if snapshot.record else 0
        if self._cordon is not None and snapshot.cordon is None:
            self._watchers.uncordoned(self._cordon)
        self._cordon = snapshot.cordon
        leader = snapshot.leader if snapshot.leader_name == self.name else None
        if leader != self._leader:
            self._log.info(
                "leadership %s", "acquired" if leader else f"held by {snapshot.leader_name}"
            )
        acquired = leader is not None and self._leader is None
        self._leader = leader
        if acquired:  # now its stream listener must watch the events too (runtime/jobrun.py)
            self._wake_listeners()
        if leader is None and snapshot.leader_deadline_ms is not None:
            # A dead leader is replaced when its lease lapses, not up to a heartbeat later.
            lapse = now + (snapshot.leader_deadline_ms - snapshot.now_ms) / 1000 + 0.005
            self._next_sync = min(self._next_sync, max(lapse, now + 0.01))
        self._metrics.synced(self._clock() - now, snapshot.record, leader is not None, now)
        self._notify.ready(self._status_line())  # joined Redis: the service has started
        return snapshot

    def _watch(self, now: float) -> None:
        """Execute what the watch found: fail a hung rank or one hit by an application XID,
        cordon (and drain) on a node-level GPU fault, lift a GPU cordon (gpu/policy.py)."""
        found = self._watchers.check(
            now, self._workers.status(), self._cordon, self._workers.dump_stacks
        )
        self._events += found.events
        for kind, seconds in found.detected:
            self._metrics.detected(kind, seconds)
        if found.fail is not None:
            self._log.warning("local rank %d failed: %s", found.fail.local_rank, found.fail.message)
            self._workers.mark_failed(found.fail.local_rank, found.fail.kind, found.fail.code)
            self._metrics.worker_failed(found.fail.kind)
        try:
            if found.cordon is not None:
                self._log.warning("cordoning this node: %s", found.cordon.reason)
                cordon = found.cordon
                self._call(lambda: self._store.cordon(self.name, cordon), "cordon")
                self._cordon = found.cordon
            if found.uncordon:
                self._log.info("GPU condition cleared: lifting this node's cordon")
                by = "gpu (auto_uncordon)"
                self._call(lambda: self._store.uncordon(self.name, by), "uncordon")
                self._cordon = None
        except CoordinationError as exc:
            self._log.warning("cannot update this node's cordon now: %s", exc)
        if found.anything:
            self._dirty = True

    def _measure_speed(self, now: float) -> None:
        """Once a window: this node's ranks' pace, for the leader's slow-node watch."""
        if self._speed is None:
            return
        speed = self._speed.tick(
            now, self._workers.status(), self._watchers.last_progress(), self._workers.workers()
        )
        if speed is None:
            return
        self._metrics.node_work(
            {
                "step": speed.step_s,
                "busy": speed.busy_s,
                "cpu": speed.cpu_s,
                "delay": speed.delay_s,
                "compute": speed.compute_s,
            }
        )
        try:
            self._call(lambda: self._store.put_speed(speed), "write this node's speed")
        except CoordinationError as exc:  # the next window says it again
            self._log.info("cannot write this node's speed: %s", exc)

    def _fence_due(self, now: float) -> bool:
        return self._lease.fence_due(now)

    @property
    def _drained(self) -> bool:
        """This node leaves the job's next generation of its own accord: it is drained, or its
        agent is shutting down (`systemctl stop`). Either way it hands the save its workers made
        as they stopped to its successors before it acknowledges (job/checkpoints/handover.py):
        else the new world, lacking its ranks of that step, went back to the committed one
        (found on the booted nodes: 6 steps lost to a `systemctl stop` on a member)."""
        return self.drained_from_job is not None or self._shutting_down

    def _holds_back(self, group: GroupStatus) -> bool:
        """This node's tiers hold back its acknowledgement of the next generation."""
        assert self._tiers is not None
        held = self._tiers.holds_back(group, self.record, self._drained)
        return held or self._awaiting_announcement(group)

    def _awaiting_announcement(self, group: GroupStatus) -> bool:
        """Shutting down, this node hands its stop save over once the leader announces the
        generation it leaves; its workers may stop before that announcement comes (the leader
        makes it at its next round after reading this node LEAVING). Until it comes, or for a
        lease at most (no leader to announce: the whole job stopping), the node stays."""
        record, began = self.record, self._shutdown_began
        if not self._shutting_down or began is None or record is None or group.active:
            return False
        if self._tiers is None or not self._tiers.hands_over:
            return False
        if record.state is not JobState.RUNNING or self.name not in record.members:
            return False
        return self._clock() - began < self.config.timing.lease_ttl

    def _local_view(self, now: float) -> LocalView:
        group = self._workers.status()
        return LocalView(
            name=self.name,
            acked_generation=self._acked,
            group=group,
            record=self.record,
            shutting_down=self._shutting_down,
            fence=self._fence_due(now),
            fenced_generation=self._fenced_generation,
            cordon=self._cordon,
            unfit=self._watchers.unfit,
            in_place=self.config.job.in_place,
            warm_ups=self.config.job.warm_ups,
            tiers_settling=self._tiers is not None and self._holds_back(group),
            tiers_copying=self._tiers is not None and self._tiers.holds_start(self.record),
            signalled=self._signalled,
        )

    def _next_wakeup(self) -> float:
        deadlines = [self._next_sync if self._last_error is None else self._retry_at]
        if (stop_deadline := self._workers.next_deadline()) is not None:
            deadlines.append(stop_deadline)
        expiry = self._leadership.next_expiry
        if self._leader is not None and expiry is not None:
            deadlines.append(expiry)
        if self._peers is not None and (count := self._peers.next_due) is not None:
            deadlines.append(count)
        if (ping := self._notify.next_ping()) is not None:
            deadlines.append(ping)
        if (hang_check := self._watchers.next_check()) is not None:
            deadlines.append(hang_check)
        if self._speed is not None and (window_end := self._speed.next_due()) is not None:
            deadlines.append(window_end)
        if self._leader is not None and (judgment := self._slow.next_due()) is not None:
            deadlines.append(judgment)
        if self._tiers is not None and (
            self._holds_back(self._workers.status()) or self._tiers.awaiting_share
        ):
            deadlines.append(self._clock() + SETTLE_POLL_S)
        point = self._lease.fence_point
        if point is not None and self._fenced_generation is None:
            deadlines.append(point)
        return min(deadlines)

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
            self._leader = None
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
                self._leave()
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
        watch = self._watchers
        specs = worker_specs(
            self._base_env,
            self.config,
            record,
            action.group_rank,
            watch.usable_gpus,
            watch.gpu_uuids,
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
        self._metrics.workers_started(record.generation, self._clock())
        self._watchers.started(started.specs, self._clock())
        ranks = [spec.rank for spec in specs]
        self._events.append(worker_events.started(self.name, record.generation, ranks, started))

    def _leave(self) -> None:
        try:
            event = Event("node_left", node=self.name, message="agent stopped")
            self._call(lambda: self._store.leave(self.name, event), "leave")
        except CoordinationError as exc:
            self._log.warning("could not remove the lease (%s); it will expire", exc)
        self._left = True

    def _wake_listeners(self) -> None:
        """An entry on the wake stream: this agent's listener, blocked on that stream alone
        while it followed, returns and watches the events and commands from now on."""
        try:
            self._call(lambda: self._store.wake(f"leader {self.name}"), "wake")
        except CoordinationError as exc:  # it still ticks every heartbeat
            self._log.info("could not wake the stream listener: %s", exc)

    @property
    def drained_from_job(self) -> Cordon | None:
        """This node's cordon in the job when it drains it (an operator's, the slow-node
        policy's): the job goes on without this node."""
        return self._cordon if self._cordon is not None and self._cordon.drain else None

    @property
    def leading(self) -> bool:
        """This agent held the leader lease at its last sync."""
        return self._leader is not None

    def _lead(self, snapshot: Snapshot) -> None:
        assert self._leader is not None
        led = self._leadership.lead(self._leader, snapshot)
        if led.rev is not None:
            self._rev = led.rev
        if led.record is not None:
            self.record = led.record
            self.log_context.generation = led.record.generation
        if led.again:
            self._dirty = True
        self._leadership.account(snapshot.now_ms, self.record.generation if self.record else 0)
        # the record as stored, whole: a node's own record names only its own place
        record = led.record or snapshot.stored_record
        self._events += self._slow.tick(
            self._leader, record, lambda: snapshot.cluster_view().nodes, snapshot.now_ms
        )


_ANNOUNCED = {NodeState.LEAVING: "node_leaving", NodeState.FENCED: "node_fenced"}
