"""Every node's loop: its pool membership and the jobs it serves, as separate pieces.

The pool side (pool/member.py) heartbeats to the pool and, on the node holding the pool leader
lease, schedules. The job side is an Agent (job/agent.py) for each job this node is placed on:
it joins that job through the job's own protocol (its keys, leader, generations, fencing and
restart budgets). This loop only reconciles the two: placed on a job and not serving it, it
reads the job's spec and starts serving it, or refuses it (the spec's user is not allowed
here; the scheduler then places the job elsewhere); no longer placed on a job it serves, it
asks that job's agent to leave (its workers get the stop grace) and waits until it has.

A node is placed on one job whole, or shared by jobs that asked for GPUs (pool/sharing.py):
then each gets GPU units of its own, chosen here from what the node offers and no other job
holds (`grant`), and its agent hands its workers only those. A whole-node job starts once every
job sharing the node left it, and a shared one once a whole-node job left.

A node whose config has a `job:` section is pinned to that job: it serves it from the start,
whatever the pool says, and makes it known to the pool (`nodeagentctl jobs` shows it). With no
pool at all (`nodeagent launch`, an embedded Redis: `member` None) the loop serves the pinned
job once and returns its exit code, as torchrun does: the same loop, one member fewer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from nodeagent.checkpoint import space
from nodeagent.checkpoint.space import check_room
from nodeagent.config.settings import CheckpointConfig, Config, NodeSettings
from nodeagent.errors import ConfigError
from nodeagent.model.gpus import GpuUnit
from nodeagent.model.job import GpuSummary
from nodeagent.model.pool import MAX_REFUSED
from nodeagent.model.resources import NodeOffer
from nodeagent.model.spec import JobSpec, run_config, spec_of
from nodeagent.pool.member import NodeState
from nodeagent.runtime.pulls import Pulled, Pulling, PullRefused, Pulls
from nodeagent.runtime.wakeup import Waker
from nodeagent.telemetry.sdnotify import Notifier

log = logging.getLogger(__name__)
REFUSALS_KEPT = MAX_REFUSED // 2  # jobs this node refused, reported to the pool
PULL_POLL_S = 1.0  # how often a loop waiting for a pull looks, besides the pull's own wake-up


class Membership(Protocol):
    """This node's part in its pool (pool/member.py's PoolMember)."""

    @property
    def placement(self) -> str | None: ...
    @property
    def shares(self) -> dict[str, int]: ...
    @property
    def synced(self) -> bool: ...
    @property
    def last_error(self) -> str | None: ...

    def due(self, now: float) -> bool: ...
    def beat(self, state: NodeState, until: float | None = None) -> bool: ...
    def next_wakeup(self) -> float: ...
    def leave(self) -> None: ...
    def poke(self) -> None: ...
    def submit_pinned(self, spec: JobSpec) -> None: ...
    def spec(self, job_id: str) -> JobSpec | str | None: ...


class JobRunner(Protocol):
    """One job this node serves (runtime/jobrun.py: an Agent and what only it uses)."""

    job_id: str

    @property
    def outcome(self) -> int | None:
        """The job's exit code once it ended, for a loop with no pool (else None)."""

    @property
    def left(self) -> bool: ...

    def step(self) -> float: ...
    def critical_at(self) -> float | None:
        """When its lease next needs this loop (job/agent.py's `critical_at`)."""

    def request_stop(self) -> None: ...
    def close(self, keep_tiers: bool = True) -> None: ...
    def unfit(self) -> str | None: ...
    def drained(self) -> str | None: ...
    def healthz(self) -> tuple[bool, str]: ...
    def pulled(self, ready: Pulled) -> None: ...


class Listener(Protocol):
    """A thread that wakes the loop on the pool's events (coord/listener.py)."""

    def start(self) -> None: ...
    def stop(self) -> None: ...


class NodeLoop:
    def __init__(
        self,
        settings: NodeSettings,
        member: Membership | None,
        start_job: Callable[[Config, tuple[str, ...] | None], JobRunner],
        waker: Waker,
        clock: Callable[[], float],
        metrics_address: Callable[[], str | None] = lambda: None,
        listener: Listener | None = None,
        notifier: Notifier | None = None,
        sweep: Callable[[NodeSettings, tuple[str, ...]], object] | None = None,
        pulls: Pulls | None = None,
        inventory: Callable[[], tuple[GpuUnit, ...]] = tuple,
        offer: Callable[[], NodeOffer | None] = lambda: None,
        gpu: Callable[[], GpuSummary | None] = lambda: None,
    ) -> None:
        """`inventory`: the GPU units this node offers (gpu/inventory.py), advertised to the
        pool at each heartbeat with the job holding each; `offer`: what it offers its jobs in
        memory and CPUs (model/resources.py), advertised alike so the scheduler counts them;
        `gpu`: its GPU verdicts (gpu/health.py verdicts_only), advertised so `nodes` and
        `health --node` show them whether it serves a job or not."""
        if member is None and settings.job is None:
            raise ValueError("a node loop with no pool serves its config's job: there is none")
        self._settings = settings
        self._member = member
        self._start_job = start_job
        self._waker = waker
        self._clock = clock
        self._inventory = inventory
        self._offer = offer
        self._gpu = gpu
        self._metrics_address = metrics_address
        self._listener = listener
        self._notify = notifier or Notifier(None)
        self.runners: dict[str, JobRunner] = {}  # job -> its agent here
        self._grants: dict[str, tuple[str, ...]] = {}  # a job sharing the node -> its GPUs
        self._tiers: dict[str, CheckpointConfig] = {}  # a job served -> its memory tier's
        self._due: dict[str, float] = {}  # job -> when its agent wants its next pass
        self._refused: dict[str, str] = {}
        self._stopping = False
        self._asked: set[str] = set()  # the jobs whose agents were asked to leave
        self._sweep = sweep or sweep_tiers
        self._swept: tuple[str, ...] | None = None  # the jobs wanted at the last sweep
        self._pulls = pulls or Pulls(waker.wake)
        self._pulling: str | None = None  # the image a job waits for (healthz says so)
        self._ready: Pulled | None = None  # the image of the job about to start

    def request_stop(self) -> None:
        """First call: the job's agent leaves gracefully, then this node leaves the pool.
        Second call: its workers are killed now. Flags only (safe from a signal handler)."""
        self._stopping = True
        for job_id, runner in self.runners.items():
            runner.request_stop()  # a second request_stop means "force"
            self._asked.add(job_id)

    def healthz(self) -> tuple[bool, str]:
        if len(self.runners) == 1:
            return next(iter(self.runners.values())).healthz()
        if self.runners:
            said = {job_id: runner.healthz() for job_id, runner in sorted(self.runners.items())}
            return all(ok for ok, _ in said.values()), "; ".join(
                f"{job_id}: {why}" for job_id, (_, why) in said.items()
            )
        if self._pulling is not None:
            return False, f"pulling image {self._pulling}"
        if self._member is None:
            return False, "not serving its job yet"
        if not self._member.synced:
            return False, f"not in the pool yet: {self._member.last_error or 'starting'}"
        return True, "ok: free, in pool " + self._settings.pool.name

    def run(self) -> int | None:
        """Until stopped (None) or, with no pool, until the pinned job ended: its exit code."""
        if self._listener is not None:
            self._listener.start()
        try:
            return self._run()
        finally:
            if self._listener is not None:
                self._listener.stop()

    def _run(self) -> int | None:
        pinned, member = self._settings.job, self._member
        if pinned is not None and member is not None:
            member.submit_pinned(spec_of(pinned, self._settings.timing))
        woken = True
        while True:
            now = self._clock()
            if member is not None and member.due(now) and not self._leaving:
                # The pool's calls return by the time a job's lease needs this loop again:
                # in a Redis outage they would hold it past the moment a ride may begin.
                critical = [at for r in self.runners.values() if (at := r.critical_at())]
                member.beat(self._state(), min(critical, default=None))
                if member.synced:  # in the pool: systemd may consider the service started
                    self._notify.ready(self._status_line())
            if not self.runners and member is not None:  # else the jobs' agents report
                self._notify.report(self._status_line(), self._stopping)
            self._reconcile()
            if member is None and pinned is not None and pinned.id in self._refused:
                log.error("cannot serve job %s: %s", pinned.id, self._refused[pinned.id])
                return 1  # served once, and it could not start (its image, say)
            self._sweep_stale()
            waits = [] if member is None else [member.next_wakeup()]
            if (ping := self._notify.next_ping()) is not None:
                waits.append(ping)
            for job_id, runner in list(self.runners.items()):
                # Only when something happened or it is due: the pool's own heartbeats must not
                # add job heartbeats (each pass of an agent syncs with Redis).
                due = self._due.get(job_id)
                if woken or due is None or self._clock() >= due:
                    due = self._due[job_id] = self._clock() + runner.step()
                    self._refuse_if_drained(member, runner)
                waits.append(due)
                if runner.left:
                    log.info("left job %s", job_id)
                    ended = runner.outcome
                    runner.close(keep_tiers=self._stopping)
                    self._forget(job_id)
                    waits.append(0.0)
                    if member is None:  # served once
                        return ended
                    member.poke()  # the pool learns at once that this node serves less
            if self._leaving:
                # STOPPING=1 (once), also when the stop came after this pass's report
                self._notify.report(self._status_line(), True)
                if member is not None:
                    member.leave()
                return None
            if self._pulling is not None:  # a pull's end wakes the loop; look now and then too
                waits.append(self._clock() + PULL_POLL_S)
            woken = self._waker.wait(max(0.0, min(waits) - self._clock()))

    def _forget(self, job_id: str) -> None:
        del self.runners[job_id]
        self._tiers.pop(job_id, None)
        self._due.pop(job_id, None)
        self._grants.pop(job_id, None)
        self._asked.discard(job_id)

    @property
    def _leaving(self) -> bool:
        return self._stopping and not self.runners

    def _status_line(self) -> str:
        serving = f"joining job {', '.join(sorted(self.runners))}" if self.runners else "free"
        return f"{serving} in pool {self._settings.pool.name}"

    def _whole(self) -> JobRunner | None:
        """The runner of the job this node is placed on whole, if any."""
        runners = list(self.runners.items())  # (the metrics thread asks too: a copy, whole)
        return next((r for j, r in runners if j not in self._grants), None)

    def gpu_holders(self) -> dict[str, str]:
        """Each GPU unit (UUID) a job holds on this node -> that job: those given to the jobs
        that share the node; every unit the node offers to a job that has it whole, whether
        its workers use each or not (its device cgroup allows them all, and the accounting
        charges them all: `nodes --gpus` showed a MIG instance no worker used as free). (Read by
        the metrics thread: it copies the dicts it reads.)"""
        holder = {uuid: job for job, grant in dict(self._grants).items() for uuid in grant}
        whole = self._whole()
        if whole is not None:
            holder.update(dict.fromkeys((u.uuid for u in self._inventory()), whole.job_id))
        return holder

    def _state(self) -> NodeState:
        whole = self._whole()
        holder = self.gpu_holders()
        return NodeState(
            serving=whole.job_id if whole is not None else None,
            unfit=whole.unfit() if whole is not None else None,
            gpus=tuple(replace(u, job=holder.get(u.uuid)) for u in self._inventory()),
            sharing=tuple(sorted(self._grants)),
            refused=dict(self._refused),
            metrics=self._metrics_address(),
            pulling=self._pulling,
            offer=self._offer(),
            gpu=self._gpu(),
        )

    def _wanted(self) -> dict[str, int | None]:
        """The jobs this node is placed on: whole (None), or sharing it with the units each
        holds."""
        if self._settings.job is not None:
            return {self._settings.job.id: None}
        if self._member is None:
            return {}
        if self._member.placement is not None:
            return {self._member.placement: None}
        return dict(self._member.shares)

    def _reconcile(self) -> None:
        wanted = {} if self._stopping else self._wanted()
        for job_id, runner in self.runners.items():
            if job_id not in wanted and job_id not in self._asked:
                why = "stopping" if self._stopping else "no longer placed on it"
                log.info("leaving job %s (%s)", job_id, why)
                runner.request_stop()
                self._asked.add(job_id)
        for job_id, units in wanted.items():
            if job_id in self.runners or job_id in self._refused:
                continue
            if units is None and self.runners:
                continue  # a whole node: once every job before it left
            if units is not None and self._whole() is not None:
                continue  # shared from now on: once the whole-node job left
            grant = None if units is None else self._grant(units)
            if units is not None and grant is None:
                continue  # its units are still another job's, leaving: a later pass
            config = self._config_for(job_id)
            if config is None:
                continue
            log.info("serving job %s%s", job_id, f" on GPUs {', '.join(grant)}" if grant else "")
            try:
                runner = self.runners[job_id] = self._start_job(config, grant)
            except ConfigError as exc:  # more than this node can give it (runtime/joblimits.py)
                log.warning("refusing job %s: %s", job_id, exc)
                self._refuse(job_id, str(exc))
                continue
            if config.job.checkpoint is not None:
                self._tiers[job_id] = config.job.checkpoint
            if grant is not None:
                self._grants[job_id] = grant
            if self._ready is not None:
                runner.pulled(self._ready)
                self._ready = None
            if self._member is not None:
                self._member.poke()  # the pool learns at once, not a pool heartbeat later

    def _grant(self, units: int) -> tuple[str, ...] | None:
        """`units` GPUs this node offers that no job it serves holds (None: not so many)."""
        held = {uuid for grant in self._grants.values() for uuid in grant}
        free = [u.uuid for u in self._inventory() if u.uuid not in held]
        return tuple(free[:units]) if len(free) >= units else None

    def _sweep_stale(self) -> None:
        """Between jobs, once per job wanted: the memory tiers of jobs this node left while its
        agent was down (space.sweep)."""
        member = self._member
        if self.runners or member is None or not member.synced or self._stopping:
            return
        wanted = tuple(sorted(self._wanted()))
        if self._swept != wanted:
            self._swept = wanted
            self._sweep(self._settings, wanted)

    def _config_for(self, job_id: str) -> Config | None:
        settings = self._settings
        try:
            if settings.job is not None and settings.job.id == job_id:
                return self._pulled(settings.running(settings.job))
            if self._member is None:
                return None
            spec = self._member.spec(job_id)
            if spec is None:  # Redis cannot be asked now: try again at the next pass
                return None
            if isinstance(spec, str):
                raise ConfigError("", f"its spec cannot be read: {spec}")
            config = run_config(spec, settings)
            if config.job.checkpoint is not None:  # its share of the memory tier's space
                beside = {j: tier for j, tier in self._tiers.items() if j != job_id}
                check_room(config.job.checkpoint, settings.node.name, job_id, beside)
            return self._pulled(config)
        except ConfigError as exc:
            log.warning("refusing job %s: %s", job_id, exc)
            self._refuse(job_id, str(exc))
            return None

    def _refuse(self, job_id: str, why: str) -> None:
        self._refused[job_id] = why
        while len(self._refused) > REFUSALS_KEPT:  # the oldest go: a report stays small
            del self._refused[next(iter(self._refused))]

    def _refuse_if_drained(self, member: Membership | None, runner: JobRunner) -> None:
        """A pool job that drained this node (its slow-node policy, an operator's `--job J
        drain`) goes on without it: the node refuses it from now on, so that the pool takes it
        off the job at once, frees it for others, and never lends it back to that job (as its
        standby, say: a drained node cannot stand by). Until the agent restarts, as any
        refusal. Not a pinned node's own job: that node serves nothing else."""
        if member is None or runner.job_id in self._refused:
            return
        pinned = self._settings.job
        why = runner.drained()
        if why is None or (pinned is not None and pinned.id == runner.job_id):
            return
        log.info("refusing job %s from now on: it drained this node (%s)", runner.job_id, why)
        self._refuse(runner.job_id, f"drained from it by {why}")
        member.poke()

    def _pulled(self, config: Config) -> Config | None:
        """`config` once its image is on this node (None while it is being pulled).

        Raises:
            ConfigError: naming `container`: the pull failed (the node's refusal of the job).
        """
        container = config.job.container
        if container is None:
            return config
        state = self._pulls.state(config)
        if isinstance(state, Pulling):
            self._pulling = state.image
            return None
        self._pulling = None
        if isinstance(state, PullRefused):
            self._pulls.forget(state.image)  # asked again only if the job is placed here again
            raise ConfigError("container", f"node {config.node.name}: {state.reason}")
        self._pulls.forget(state.image)  # the next job asks again: the image may be removed
        self._ready = state
        return config


def sweep_tiers(settings: NodeSettings, serving: tuple[str, ...]) -> None:
    """space.sweep under the memory_dir a submitted job's tier goes in, and the pinned job's."""
    dirs = [CheckpointConfig.memory_dir]
    pinned = settings.job.checkpoint if settings.job is not None else None
    if pinned is not None:
        dirs.append(pinned.memory_dir)
    for path in space.sweep(dirs, settings.node.name, serving):
        log.info("removed memory tier %s: the node left its job while its agent was down", path)
