"""A node's membership in its pool: the pool heartbeat, and the pool leader's round when this
node holds that lease.

The pool heartbeat is not what fences workers (each job's own lease does), so its Redis calls
are bounded by one heartbeat, not by a fence point, and a failed one only delays placements.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from nodeagent import __version__
from nodeagent.config.settings import NodeSettings
from nodeagent.coord.bounded import BoundedCalls
from nodeagent.coord.durable import Durability
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.requests import RequestStore
from nodeagent.errors import CoordinationError, FencedError
from nodeagent.model.credential import MungeUnavailable
from nodeagent.model.fairshare import QUEUE, FairShare
from nodeagent.model.gpus import GpuUnit
from nodeagent.model.job import GpuSummary
from nodeagent.model.pool import PoolNode
from nodeagent.model.resources import NodeOffer
from nodeagent.model.spec import JobSpec
from nodeagent.pool import leadership, lifecycle
from nodeagent.pool.authority import Authority
from nodeagent.pool.fairness import Fairness
from nodeagent.pool.ledger import Bookkeeper
from nodeagent.pool.notify import Webhooks
from nodeagent.pool.schedule import PoolView, SchedulePolicy
from nodeagent.pool.serving import Serving

log = logging.getLogger(__name__)
# While requests keep coming (one was taken since the last round began), a round waits until
# DEFER_RATIO times as long as the last round took has passed since it (at most DEFER_MAX_BEATS
# heartbeats): rounds then take at most a third of the leader's time during a burst, however
# many jobs wait (a round at 10,000 pending jobs took 0.3-0.5 s here), and the requests, served
# on their own thread (pool/serving.py), the rest. Slurm's defer and sched_min_interval, adapted
# to what a round costs.
DEFER_RATIO = 2.0
DEFER_MAX_BEATS = 10
T = TypeVar("T")
CALL_FLOOR_S = 0.01  # a call's least budget when a job's lease is due now
_PREEMPTIONS = {"job_shrunk": "shrink", "job_evicted": "evict"}  # pool event -> metric kind


@dataclass(frozen=True)
class NodeState:
    """What the node side tells the pool about itself at each heartbeat."""

    serving: str | None = None
    unfit: str | None = None
    refused: Mapping[str, str] = field(default_factory=dict)
    metrics: str | None = None
    pulling: str | None = None  # the image of the job placed here, before its agent starts
    gpus: tuple[GpuUnit, ...] = ()  # the units it offers, each with the job holding it
    sharing: tuple[str, ...] = ()  # the jobs sharing it whose agents run here
    offer: NodeOffer | None = None  # what it offers its jobs beside GPUs (None: not said)
    gpu: GpuSummary | None = None  # its GPU verdicts, job or not (None: not said)


class PoolMember:
    def __init__(
        self,
        store: PoolStore,
        settings: NodeSettings,
        clock: Callable[[], float],
        authority: Authority | None = None,
        wall: Callable[[], float] = time.time,
        notifier: Webhooks | None = None,
        bookkeeper: Bookkeeper | None = None,
        server: Serving | None = None,
    ) -> None:
        """`authority`: pool.auth munge (None: none, whoever writes Redis is trusted); `wall`:
        the clock of the heartbeat time the metrics export (`clock` may be monotonic);
        `notifier`: pool.notify's, when the operator named endpoints; `bookkeeper`:
        pool.accounting's, when records are kept; `server`: what serves the signed requests
        while this node leads the pool (pool.auth munge)."""
        self._notifier = notifier
        self.bookkeeper = bookkeeper
        self._wall = wall
        self._store = store
        self._authority = authority
        self._server = server
        self._auth = RequestStore(store.client, store.keys)  # where pool.auth is said
        self._auth_said: str | None = None  # the leader term (lease value) it was said in
        self._auth_error: str | None = None  # said once
        self._settings = settings
        self._clock = clock
        self._calls = BoundedCalls(clock)
        self._until: float | None = None  # its calls return by then (beat's `until`)
        pool = settings.pool
        self._policy = SchedulePolicy(
            reserve_after_ms=int(pool.reserve_after * 1000),
            resize_cooldown_ms=int(pool.resize_cooldown * 1000),
            preempt_after_ms=int(pool.preempt_after * 1000),
            keep_ended_ms=int(pool.keep_ended * 1000),
            ride_through_ms=int(settings.timing.ride_through * 1000),
        )
        self._pruning = lifecycle.Pruning()  # when this node, leading, last pruned
        self._stopping = lifecycle.Stopping()  # the cancelled jobs it told to stop
        fair = pool.fair_share
        shares = {**fair.shares, **{QUEUE + q: n for q, n in fair.queues.items()}}
        policy = FairShare(fair.weight, fair.half_life, shares)
        self._fairness = Fairness(policy) if policy.on else None
        self._views = leadership.NodeViews()  # kept between rounds while this node leads
        self._round_s = 0.0  # how long its last round as pool leader took
        self._round_began = self._round_end = 0.0  # when it began and ended
        self.placement: str | None = None  # the job it is placed on whole
        self.shares: dict[str, int] = {}  # or: the jobs sharing it, and the units each holds
        self._garbage: tuple[str, ...] = ()
        self.leading = False
        self.synced = False  # a heartbeat went through since start
        self.last_error: str | None = None
        self.redis_errors = 0  # pool calls that failed (the pool's metrics count them)
        # The wall time of the last pool heartbeat that went through (the metrics export it).
        self.beaten_at: float | None = None
        # The view the last pool leader round scheduled from (nodeagent/pool/metrics.py reads
        # it on the HTTP thread: assigning a reference is atomic and a PoolView is frozen).
        self.last_view: PoolView | None = None
        # Preemptions this node made as pool leader, by kind (shrink): a counter per process,
        # summed over the nodes by a query (a failover starts another node's count).
        self.preemptions: dict[str, int] = {}
        self._next = 0.0

    @property
    def name(self) -> str:
        return self._settings.node.name

    def _interval(self) -> float:
        """The pool leader rounds every heartbeat while the pool has submitted jobs (a job's end
        frees its nodes within one); otherwise, and on every other node, the pool lease is renewed
        twice per lease: a dead node is found when its lease lapses either way, and what
        concerns a node (a submission, a placement) wakes it through the pool's stream at once.
        So pool membership costs a node 1/(lease_ttl/2) calls a second, not one per heartbeat on
        top of its job's, and a pool of pinned nodes only (a single-job deployment) no more."""
        timing = self._settings.timing
        busy = self.last_view is not None and any(
            not job.status.pinned for job in self.last_view.jobs.values()
        )
        return timing.heartbeat_interval if self.leading and busy else timing.lease_ttl / 2

    def poke(self) -> None:
        """Heartbeat at the next pass of the loop (a pool event arrived). Any thread."""
        self._next = 0.0

    def due(self, now: float) -> bool:
        return now >= self._next

    def next_wakeup(self) -> float:
        return self._next

    def beat(self, state: NodeState, until: float | None = None) -> bool:
        """One pool heartbeat (and, as pool leader, one round). True when the placement
        changed. `until`: its Redis calls return by then (a job's lease needs the loop)."""
        self._until = until
        timing = self._settings.timing
        report = PoolNode(
            name=self.name,
            address=self._settings.node.address,
            lease_ttl_ms=int(timing.lease_ttl * 1000),
            labels=dict(self._settings.pool.labels),
            pinned=self._settings.job.id if self._settings.job is not None else None,
            serving=state.serving,
            unfit=state.unfit,
            refused=dict(state.refused),
            metrics=state.metrics,
            pulling=state.pulling,
            gpus=state.gpus,
            sharing=state.sharing,
            containers=self._settings.containers,
            version=__version__,
            memory=state.offer.shared if state.offer is not None else 0,
            mem_per_gpu=state.offer.per_gpu if state.offer is not None else 0,
            cpus_per_gpu=state.offer.cpus_per_gpu if state.offer is not None else 0,
            gpu=state.gpu,
        )
        start = self._clock()
        self._next = start + self._interval()
        try:
            beat = self._store_call(lambda: self._store.sync(report), "pool heartbeat")
        except CoordinationError as exc:
            self._failed(exc)
            self._next = self._clock() + timing.heartbeat_interval / 2
            return False
        if self.last_error is not None:
            log.info("pool: Redis reachable again")
        self.last_error = None
        self.synced = True
        self.beaten_at = self._wall()
        leading = beat.leader_name == self.name
        if leading != self.leading:
            log.info("pool leadership %s", "acquired" if leading else f"held by {beat.leader_name}")
        self.leading = leading
        self._next = start + self._interval()
        if not leading and beat.leader_deadline_ms is not None:
            lapse = start + (beat.leader_deadline_ms - beat.now_ms) / 1000 + 0.005
            self._next = min(self._next, max(lapse, start + 0.01))
        changed = beat.placement != self.placement or beat.shares != self.shares
        if changed:
            shared = ", ".join(f"{j} ({n} GPUs)" for j, n in sorted(beat.shares.items()))
            log.info("pool: placed on %s", beat.placement or shared or "nothing (free)")
        self.placement, self.shares = beat.placement, dict(beat.shares)
        if self._server is not None:
            self._server.lead(beat.leader if leading else None)
        if leading and beat.leader is not None:
            self._lead(beat.leader)
        return changed

    def _store_call(self, fn: Callable[[], T], what: str) -> T:
        now = self._clock()
        deadline = now + self._settings.timing.lease_ttl / 2
        if self._until is not None:
            deadline = min(deadline, max(self._until, now + CALL_FLOOR_S))
        return self._calls.run(fn, deadline, what)

    @property
    def durability(self) -> Durability:
        """pool.durability, as coord/durable.py applies it."""
        durable = self._settings.pool.durability
        return Durability(durable.replicas, int(durable.timeout * 1000))

    def _say_auth(self, token: str) -> None:
        """Say pool.auth and pool.durability once per term (nodeagentctl signs its requests
        when it reads munge, and confirms its own writes under none). A failure is said once
        and holds back no scheduling."""
        if token == self._auth_said:
            return
        mode, durability = self._settings.pool.auth, self.durability
        try:
            self._store_call(
                lambda: self._auth.publish_auth(mode, durability), "say the pool's auth"
            )
        except CoordinationError as exc:
            why = f"pool requests: {exc}"
            if why != self._auth_error:
                log.warning("%s", why)
            self._auth_error = why
            return
        self._auth_said, self._auth_error = token, None

    def _lead(self, token: str) -> None:
        vouch = self._authority.vouch if self._authority is not None else None
        self._say_auth(token)
        began = self._clock()
        if self._deferred(began):
            return
        try:
            done = self._store_call(
                lambda: leadership.lead(
                    self._store,
                    token,
                    self._policy,
                    self._views,
                    vouch,
                    self._pruning,
                    book=self.bookkeeper is not None,
                    fairness=self._fairness,
                    stopping=self._stopping,
                ),
                "pool leader round",
            )
        except FencedError as exc:
            log.info("pool leader write refused: %s", exc)
            self.leading = False
            return
        except CoordinationError as exc:
            self._failed(exc)
            return
        except MungeUnavailable as exc:
            self._failed(CoordinationError(f"pool leader round: {exc}"), redis=False)
            return
        self.last_view = done.view
        self._round_began, self._round_end = began, self._clock()
        self._round_s = self._round_end - began
        if self._notifier is not None:
            notifier = self._notifier
            try:
                self._store_call(lambda: notifier.tick(token), "tell of job changes")
            except CoordinationError as exc:
                self._failed(exc)
        if self.bookkeeper is not None:
            keeper = self.bookkeeper
            try:
                self._store_call(keeper.tick, "take ended jobs to the accounting database")
            except CoordinationError as exc:
                self._failed(exc)
        if done.garbage != self._garbage:  # said once, not at every heartbeat
            if done.garbage:
                log.warning(
                    "pool: ignoring what nodeagent did not write: %s", "; ".join(done.garbage)
                )
            self._garbage = done.garbage
        if done.write is not None:
            self._next = self._clock()  # read the placements just written
            for event in done.write.events:
                kind = _PREEMPTIONS.get(event.type)
                if kind is not None:
                    self.preemptions[kind] = self.preemptions.get(kind, 0) + 1

    def _deferred(self, now: float) -> bool:
        """Whether this round waits for a burst of requests (then the next pass of the loop
        comes when it may run)."""
        if self._server is None or self._server.taken_at < self._round_began:
            return False  # none taken since the last round began: no burst to wait for
        cap = DEFER_MAX_BEATS * self._settings.timing.heartbeat_interval
        if not defers(now - self._round_end, self._round_s, cap):
            return False
        self._next = min(self._next, self._round_end + min(DEFER_RATIO * self._round_s, cap))
        return True

    def _failed(self, exc: CoordinationError, redis: bool = True) -> None:
        """A pool call failed: said once while it keeps failing; counted when Redis failed
        it (not MUNGE, nor a leader's round that read garbage)."""
        if redis:
            self.redis_errors += 1
        if str(exc) != self.last_error:
            log.warning("pool: %s", exc)
        self.last_error = str(exc)

    def spec(self, job_id: str) -> JobSpec | str | None:
        """The spec of the job this node is placed on; a string says why there is none to run
        (unreadable, or none stored); None: Redis cannot be asked now (try again later)."""
        try:
            spec = self._store_call(lambda: self._store.spec(job_id), "read the job spec")
            if isinstance(spec, JobSpec) and self._authority is not None:
                why = self._authority.vouch(spec)
                if why is not None:
                    return f"refused: {why}"
        except CoordinationError as exc:
            self._failed(exc)
            return None
        except MungeUnavailable as exc:
            self._failed(CoordinationError(f"check the job spec: {exc}"), redis=False)
            return None
        return "no spec is stored for it" if spec is None else spec

    def submit_pinned(self, spec: JobSpec) -> None:
        """Make the job of this node's job: section known to the pool (once per job id)."""
        try:
            if self._authority is not None:
                spec = self._authority.sign(spec)
            created, _ = self._store_call(
                lambda: self._store.submit(spec, pinned=True), "submit the pinned job"
            )
        except CoordinationError as exc:
            self._failed(exc)
            return
        except MungeUnavailable as exc:
            self._failed(CoordinationError(f"sign the pinned job's spec: {exc}"), redis=False)
            return
        if created:
            log.info("pool: job %s of this node's config is now known to the pool", spec.id)

    def leave(self) -> None:
        if self._server is not None:
            self._server.stop()
        try:
            self._store_call(lambda: self._store.leave(self.name), "leave the pool")
        except CoordinationError as exc:
            log.warning("could not leave the pool (%s); the lease will expire", exc)


def defers(since_s: float, round_s: float, cap_s: float) -> bool:
    """Whether a round waits while requests still come: the leader has served for less than
    DEFER_RATIO times what its last round cost (`round_s`) since that one ended (`since_s`
    ago), and for less than `cap_s`. Pure."""
    return since_s < min(DEFER_RATIO * round_s, cap_s)
