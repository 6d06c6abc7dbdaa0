"""The leader's decisions, as a pure function of a snapshot.

`plan(view, policy, memory)` looks at what Redis holds (the job record, live node reports, expired
leases, new operator commands) and returns the record to write, the events to append, the leases
to reap, and why. No I/O: the agent executes the plan, fenced by the leader token in Lua.

The protocol it drives: to change anything, the leader announces generation g+1 (RESTARTING);
every live agent stops its workers and acknowledges g+1; only when all have (or their leases have
expired) does the leader choose members and write RUNNING. Workers of two generations therefore
never run at the same time.

Read in before each step: the nodes the members hold out (suspicion.hold_out), the members
whose leases lapsed while they may still be riding through a Redis outage (ridethrough.awaited:
planned as live members, awaited, never reaped) and the operator's commands (commands.py); the
events it appends about the job are made by leaderevents.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from nodeagent.config.settings import Config
from nodeagent.job import members, repeats, resume, ridethrough, slowness, stalls, suspicion
from nodeagent.job.checkpoints import restore
from nodeagent.job.commands import Requests, apply_commands
from nodeagent.job.leaderevents import job_event, names, restore_event
from nodeagent.model.job import ClusterView, Event, Failure, JobRecord, NodeReport, RestartReason
from nodeagent.model.tiers import CheckpointRecord
from nodeagent.state import JobState, NodeState

# No longer part of the generation that runs: a fenced node stopped its workers, a joining one
# restarted and lost them. Both may join the next generation.
DROPPED_OUT = frozenset(
    {NodeState.FENCED, NodeState.JOINING, NodeState.LEAVING, NodeState.DRAINING, NodeState.CORDONED}
)


@dataclass(frozen=True)
class Policy:
    """The job section of the leader's config, in the units the planner uses."""

    min_nodes: int
    max_nodes: int
    target_nodes: int
    nproc_per_node: int
    max_restarts: int
    join_settle_ms: int
    rendezvous_timeout_ms: int
    restart_backoff_ms: int = 0  # 0: crash loops do not back off
    restart_backoff_max_ms: int = 0
    restart_backoff_reset_ms: int = 0
    tiers: bool = False  # job.checkpoint: the leader chooses every generation's restore
    replicas: int = 0  # job.checkpoint.replicas: copies of each save on peers
    ride_through_ms: int = 0  # timing.ride_through: how long a member may ride through


def policy_from(config: Config) -> Policy:
    job, timing = config.job, config.timing
    return Policy(
        min_nodes=job.min_nodes,
        max_nodes=job.max_nodes,
        target_nodes=job.target_nodes,
        nproc_per_node=job.nproc_per_node,
        max_restarts=job.max_restarts,
        join_settle_ms=int(timing.join_settle * 1000),
        rendezvous_timeout_ms=int(timing.rendezvous_timeout * 1000),
        restart_backoff_ms=int(timing.restart_backoff * 1000),
        restart_backoff_max_ms=int(timing.restart_backoff_max * 1000),
        restart_backoff_reset_ms=int(timing.restart_backoff_reset * 1000),
        tiers=job.checkpoint is not None,
        replicas=job.checkpoint.replicas if job.checkpoint is not None else 0,
        ride_through_ms=int(timing.ride_through * 1000),
    )


@dataclass(frozen=True)
class LeaderMemory:
    """What a leader remembers between plans (lost on failover, which only restarts settling
    and the crash-loop count: a new leader's first restart does not back off)."""

    eligible: frozenset[str] = frozenset()
    changed_ms: int = 0
    # Worker failures of one kind in a row, each of a generation that ran less than
    # restart_backoff_reset: the exponent of the crash-loop backoff (see backoff_ms).
    crash_streak: int = 0
    crash_kind: str = ""
    held: frozenset[str] = frozenset()  # nodes held out (job/suspicion.py) whose leases hold
    # Since when the members of a generation whose record Redis lost are awaited (resume.py).
    resume_since_ms: int | None = None


@dataclass(frozen=True)
class Plan:
    record: JobRecord | None  # the record to write; None when nothing changes
    events: tuple[Event, ...]
    reap: tuple[str, ...]
    memory: LeaderMemory
    reason: str
    drop: tuple[tuple[str, str], ...] = ()  # garbage leases to remove
    held: frozenset[str] = frozenset()  # live leases planned as lapsed (job/suspicion.py)
    # The reports planned from: the live ones but those held out, each with only the saves on
    # the job's timeline (restore.current). The copies are handed out from these too.
    nodes: Mapping[str, NodeReport] = field(default_factory=dict)

    @property
    def writes(self) -> bool:
        return bool(self.record is not None or self.events or self.reap or self.drop)


@dataclass(frozen=True)
class _Context:
    view: ClusterView
    policy: Policy
    memory: LeaderMemory
    eligible: tuple[str, ...]
    requests: Requests
    held: frozenset[str] = frozenset()  # held out now (job/suspicion.py): alive, maybe training
    awaited: frozenset[str] = frozenset()  # lapsed, maybe riding through (job/ridethrough.py)


_Step = tuple[JobRecord, list[Event], str]


def plan(view: ClusterView, policy: Policy, memory: LeaderMemory) -> Plan:
    """Decide what the job record should become. Pure."""
    awaited = _riding(view, policy)
    expired = tuple(name for name in view.expired if name not in awaited)
    events = [_expired(name, memory, view) for name in expired]
    live = frozenset(view.nodes)
    view, held, suspected = suspicion.hold_out(view)
    events += suspected
    # Remembered while their leases hold: one held out is lost once, not again at its lease.
    memory = replace(memory, held=(held | memory.held) & live)
    base = view.record or _initial_record(view, policy)
    base, memory, waiting = _resumed(base, view, policy, memory)
    if waiting is not None:
        return Plan(None, tuple(events), expired, memory, waiting, view.drop, held, view.nodes)
    record = _refresh_policy(base, policy)
    if policy.tiers and record.checkpoint is not None and record.checkpoint.rollbacks:
        nodes = restore.current(view.nodes, record.checkpoint.rollbacks)
        view = replace(view, nodes=nodes)
    if policy.tiers:
        tiers = restore.fold(record.checkpoint or CheckpointRecord(), view.nodes, policy.replicas)
        record = replace(record, checkpoint=tiers)
    record, requests, command_events = apply_commands(record, view.commands)
    if view.command_cursor is not None:
        record = replace(record, command_cursor=view.command_cursor)
    events += command_events
    eligible = members.eligible(view.nodes)
    memory = _remember(memory, eligible, view.now_ms)
    ctx = _Context(view, policy, memory, eligible, requests, held, awaited)
    record, step_events, reason = _step(record, ctx)
    events += step_events
    record, named = _waited_on(record, view.nodes)
    events += named
    memory, backoff = _count_crash(memory, view.record, record, policy, view.now_ms)
    if backoff is not None:
        events.append(backoff)
    changed = view.record is None or record != view.record
    return Plan(
        record=record if changed else None,
        events=tuple(events),
        reap=expired,
        memory=memory,
        reason=reason,
        drop=view.drop,
        held=held,
        nodes=view.nodes,
    )


def _waited_on(record: JobRecord, nodes: Mapping[str, NodeReport]) -> tuple[JobRecord, list[Event]]:
    """The ranks every other rank waits on (job/stalls.py), named in the record: each one's node
    fails it. Said once, as they are named."""
    named = stalls.waited_on(record, nodes)
    if named == record.waited_on:
        return record, []
    record = replace(record, waited_on=named)
    if not named:
        return record, []
    ranks = ", ".join(f"local rank {w.local_rank} of {w.node}" for w in named[:8])
    message = f"every other rank waits on {ranks}{' ...' if len(named) > 8 else ''}"
    return record, [job_event("ranks_waited_on", record, message)]


def _resumed(
    base: JobRecord, view: ClusterView, policy: Policy, memory: LeaderMemory
) -> tuple[JobRecord, LeaderMemory, str | None]:
    """The record to plan from when Redis lost the one of what the members run (resume.py):
    rebuilt when every rank's report is live; else why it waits for the others (at most the
    longest ride-through, then it plans from `base` as before)."""
    now = resume.running(view.nodes)
    if not resume.lost(view.record, now):
        return base, replace(memory, resume_since_ms=None), None
    assert now is not None
    if now.whole and now.master is not None:
        found = resume.rebuilt(_refresh_policy(base, policy), now, view.nodes, view.now_ms)
        return found, replace(memory, resume_since_ms=None), None
    since = memory.resume_since_ms if memory.resume_since_ms is not None else view.now_ms
    longest = max(policy.ride_through_ms, base.ride_through_ms)
    if view.now_ms - since >= longest:
        return base, memory, None
    why = f"Redis lost the record: waiting for {now.missing} members of generation "
    why += f"{now.generation} to come back"
    return base, replace(memory, resume_since_ms=since), why


def _riding(view: ClusterView, policy: Policy) -> frozenset[str]:
    """The members whose leases lapsed that may be riding through (job/ridethrough.py), for
    the longer of this leader's ride_through and the record's."""
    record = view.record
    longest = max(policy.ride_through_ms, record.ride_through_ms if record else 0)
    return ridethrough.awaited(record, view.expired_ms, view.nodes, view.now_ms, longest)


def _expired(name: str, memory: LeaderMemory, view: ClusterView) -> Event:
    """node_lost for a lease that lapsed; node_reaped for one of a node held out before, lost
    then already (a new leader, which remembers none, says node_lost). A lapsed member that a
    live member suspects is lost as one held out (`suspected` in its data): it may have been
    riding through a Redis outage, alive (job/ridethrough.py)."""
    if name in memory.held:
        return Event("node_reaped", node=name, message=f"lease of {name} expired (held out)")
    record = view.record
    votes = sum(1 for r in view.nodes.values() if name in r.suspects)
    if votes and record is not None and name in record.members:
        message = f"lease of {name} expired, suspected lost by {votes} members"
        return Event("node_lost", node=name, message=message, data={"suspected": votes})
    return Event("node_lost", node=name, message=f"lease of {name} expired")


def _initial_record(view: ClusterView, policy: Policy) -> JobRecord:
    """A fresh WAITING record. Generation and restart count continue from what nodes remember,
    so a Redis restart without persistence never reuses a generation number."""
    return JobRecord(
        generation=_highest_generation(view, 0),
        state=JobState.WAITING,
        reason="waiting for nodes",
        target_nodes=policy.target_nodes,
        min_nodes=policy.min_nodes,
        max_nodes=policy.max_nodes,
        nproc_per_node=policy.nproc_per_node,
        max_restarts=policy.max_restarts,
        restart_count=max((r.restart_count for r in view.nodes.values()), default=0),
        since_ms=view.now_ms,
    )


def _highest_generation(view: ClusterView, recorded: int) -> int:
    seen = [max(r.acked_generation, r.worker_generation or 0) for r in view.nodes.values()]
    return max([recorded, *seen])


def _refresh_policy(record: JobRecord, policy: Policy) -> JobRecord:
    """The leader's config is the truth for bounds; an older target is clamped into them, and
    so is a restart count no job that is still going can have (only FAILED passes the budget)."""
    restarts = record.restart_count
    if record.state is not JobState.FAILED:
        restarts = min(restarts, policy.max_restarts)
    return replace(
        record,
        ride_through_ms=policy.ride_through_ms,
        min_nodes=policy.min_nodes,
        max_nodes=policy.max_nodes,
        nproc_per_node=policy.nproc_per_node,
        max_restarts=policy.max_restarts,
        target_nodes=min(max(record.target_nodes, policy.min_nodes), policy.max_nodes),
        restart_count=restarts,
    )


def _remember(memory: LeaderMemory, eligible: Sequence[str], now_ms: int) -> LeaderMemory:
    now_eligible = frozenset(eligible)
    if now_eligible == memory.eligible:
        return memory
    return replace(memory, eligible=now_eligible, changed_ms=now_ms)


def backoff_ms(policy: Policy, streak: int) -> int:
    """How long the generation after the `streak`-th failure in a row waits: nothing after the
    first (a one-off crash restarts at once), then restart_backoff, doubling, at most
    restart_backoff_max."""
    if streak < 2 or policy.restart_backoff_ms <= 0:
        return 0
    return min(policy.restart_backoff_max_ms, policy.restart_backoff_ms << min(streak - 2, 32))


def _count_crash(
    memory: LeaderMemory,
    before: JobRecord | None,
    after: JobRecord,
    policy: Policy,
    now_ms: int,
) -> tuple[LeaderMemory, Event | None]:
    """Counts a running generation replaced for a worker failure into the crash streak (reset
    by a generation that ran restart_backoff_reset or a failure of another kind, cleared by an
    operator restart or stop) and says, as an event, how long the next generation will wait."""
    if after.reason == RestartReason.OPERATOR:
        return replace(memory, crash_streak=0, crash_kind=""), None
    why = RestartReason.of(after.reason)
    announced = (
        before is not None
        and before.state is JobState.RUNNING
        and after.state is JobState.RESTARTING
        and why is not None
        and why.charged
    )
    if not announced or before is None:
        return memory, None
    ran_ms = now_ms - before.since_ms
    quick = ran_ms < policy.restart_backoff_reset_ms and after.reason == memory.crash_kind
    streak = memory.crash_streak + 1 if quick else 1
    memory = replace(memory, crash_streak=streak, crash_kind=after.reason)
    wait = backoff_ms(policy, streak)
    if wait == 0 or after.restart_count >= after.max_restarts:  # the job fails instead
        return memory, None
    message = (
        f"failure {streak} in a row ({after.reason}, generation {before.generation} ran "
        f"{ran_ms / 1000:.1f}s): waiting {wait / 1000:g}s before generation {after.generation}"
    )
    return memory, job_event("restart_backoff", after, message)


def _step(record: JobRecord, ctx: _Context) -> _Step:
    if ctx.requests.stop and record.state is not JobState.STOPPED:
        stopped = record.moved_to(
            JobState.STOPPED,
            reason=RestartReason.OPERATOR.value,
            since_ms=ctx.view.now_ms,
            pending_failure=None,
        )
        return stopped, [job_event("job_stopped", stopped, "stopped by operator")], "stop"
    if record.state.terminal:
        if ctx.requests.restart:
            reset = record.state is JobState.FAILED
            return _begin(record, ctx, RestartReason.OPERATOR, reset_restarts=reset)
        return record, [], f"job {record.state.value}"
    if record.state is JobState.RUNNING:
        return _step_running(record, ctx)
    if record.state is JobState.RESTARTING:
        return _step_restarting(record, ctx)
    return _step_waiting(record, ctx)


def _begin(
    record: JobRecord,
    ctx: _Context,
    why: RestartReason,
    failure: Failure | None = None,
    reset_restarts: bool = False,
) -> _Step:
    """Announce generation g+1: every live agent stops its workers and acknowledges it."""
    generation = _highest_generation(ctx.view, record.generation) + 1
    reason = why.value
    new = record.moved_to(
        JobState.RESTARTING,
        generation=generation,
        reason=reason,
        since_ms=ctx.view.now_ms,
        pending_failure=failure,
        restart_count=0 if reset_restarts else record.restart_count,
        detail=repeats.describe(failure, record.detail) if failure else "",
    )
    message = f"generation {generation} announced ({reason})"
    if failure is not None and new.detail.endswith(repeats.SAME_CAUSE):
        message += f": {repeats.SAME_CAUSE}"
    return new, [job_event("generation_announced", new, message)], reason


def _failure_detail(record: JobRecord, failure: Failure) -> str:
    """The record's detail of `failure` (with what _begin said of it), else its description."""
    described = failure.describe()
    return record.detail if record.detail.startswith(described) else described


def _why_gone(reports: Sequence[NodeReport | None]) -> RestartReason:
    """The restart reason for members that dropped out: a drain is gpu_fault when the agent
    cordoned itself for a GPU fault, slow_node when the leader's slow-node policy did, operator
    when a person did; leaving is node_left."""
    if reports and all(r is not None and r.state is NodeState.LEAVING for r in reports):
        return RestartReason.NODE_LEFT
    drains = [
        r.cordon for r in reports if r is not None and r.cordon is not None and r.cordon.drain
    ]
    if drains and len(drains) == len(reports):
        if all(c.by == "gpu" for c in drains):
            return RestartReason.GPU_FAULT
        if all(c.by == slowness.BY for c in drains):
            return RestartReason.SLOW_NODE
        return RestartReason.OPERATOR
    return RestartReason.NODE_LOST


def _settled(ctx: _Context) -> bool:
    return ctx.view.now_ms - ctx.memory.changed_ms >= ctx.policy.join_settle_ms


def _member_failures(record: JobRecord, nodes: Mapping[str, NodeReport]) -> list[Failure]:
    """Failures in this generation that a member reports of one of its own ranks: anything else
    (a non-member, another node's rank) cannot be a failure of this generation's workers."""
    found = []
    for index, name in enumerate(record.members):
        failure = nodes[name].failure if name in nodes else None
        first = index * record.nproc_per_node
        if (
            failure is not None
            and failure.generation == record.generation
            and failure.node == name
            and first <= failure.rank < first + record.nproc_per_node
        ):
            found.append(failure)
    return sorted(found, key=lambda f: f.rank)


def _gone(member: str, nodes: Mapping[str, NodeReport], awaited: frozenset[str]) -> bool:
    """A member no longer in the running generation: it dropped out, or its lease lapsed and
    it is not riding through (awaited)."""
    report = nodes.get(member)
    if report is None:
        return member not in awaited
    return report.state in DROPPED_OUT


_FAILURE_REASONS = {"hang": RestartReason.WORKER_HUNG, "oom": RestartReason.WORKER_OOM}


def _step_running(record: JobRecord, ctx: _Context) -> _Step:
    nodes = ctx.view.nodes
    failures = _member_failures(record, nodes)
    if failures:
        reason = _FAILURE_REASONS.get(failures[0].kind, RestartReason.WORKER_FAILED)
        record = replace(record, checkpoint=restore.after_failure(record, nodes))
        return _begin(record, ctx, reason, failure=failures[0])
    gone = [m for m in record.members if _gone(m, nodes, ctx.awaited)]
    if gone:
        return _begin(record, ctx, _why_gone([nodes.get(m) for m in gone]))
    if all(
        m in nodes and nodes[m].succeeded_generation == record.generation for m in record.members
    ):
        done = record.moved_to(
            JobState.SUCCEEDED, reason="completed", detail="", since_ms=ctx.view.now_ms
        )
        return done, [job_event("job_succeeded", done, "every worker exited 0")], "succeeded"
    if ctx.requests.restart:
        return _begin(record, ctx, RestartReason.OPERATOR)
    # A cordoned member keeps running until the next generation (cordon is not drain).
    if record.target_nodes < len(record.members):
        return _begin(record, ctx, RestartReason.SCALE)
    current = set(record.members)  # (a tuple's `in` made this O(M^2): 0.7 s at 10,000 nodes)
    standby = [n for n in members.ready(ctx.eligible, nodes) if n not in current]
    desired = min(record.target_nodes, len(record.members) + len(standby))
    if desired > len(record.members) and (desired == record.target_nodes or _settled(ctx)):
        scaled = ctx.requests.scaled
        return _begin(record, ctx, RestartReason.SCALE if scaled else RestartReason.NODE_JOINED)
    return record, [], "running"


def _step_restarting(record: JobRecord, ctx: _Context) -> _Step:
    nodes = ctx.view.nodes
    waiting = sorted(n for n, r in nodes.items() if r.acked_generation < record.generation)
    waiting += sorted(ctx.awaited)  # riding through a Redis outage: they stop, or come back
    if waiting:
        return (
            record,
            [],
            f"waiting for {names(waiting)} to stop generation < {record.generation}",
        )
    restart_count = record.restart_count
    failure = record.pending_failure
    reason, detail = record.reason, record.detail
    eligible = set(ctx.eligible)
    lost = [m for m in record.members if m not in eligible]
    reporter = nodes.get(failure.node) if failure is not None else None
    # A worker failure while a previous member was lost is blamed on the loss (decision 11):
    # a dead peer makes the survivors' collectives fail too.
    if failure is not None and lost:
        reason = RestartReason.NODE_LOST.value
        detail = f"{failure.describe()} after losing {names(lost)}: not charged"
    elif failure is not None and (reporter is None or reporter.failure != failure):
        # Only a failure its node still reports is charged: not one written into the record.
        detail = f"{failure.describe()}: not reported by {failure.node}, not charged"
    elif failure is not None:
        restart_count += 1
        if restart_count > record.max_restarts:
            failed = record.moved_to(  # its count stays the restarts it had: `show`'s
                JobState.FAILED,
                reason="max_restarts exceeded",
                since_ms=ctx.view.now_ms,
                detail=f"{_failure_detail(record, failure)}; {record.restart_count} restarts used",
            )
            return failed, [job_event("job_failed", failed, failed.detail)], "failed"
        left_ms = (
            record.since_ms + backoff_ms(ctx.policy, ctx.memory.crash_streak) - ctx.view.now_ms
        )
        if left_ms > 0:
            return record, [], f"crash loop: generation {record.generation} starts in {left_ms}ms"
    chosen = members.next_members(
        record.members, ctx.eligible, nodes, record.target_nodes, record.min_nodes
    )
    if len(chosen) < record.min_nodes:
        waiting_record = record.moved_to(
            JobState.WAITING,
            members=(),
            restart_count=restart_count,
            pending_failure=None,
            since_ms=ctx.view.now_ms,
            reason="below min_nodes",
            detail=f"{len(chosen)} eligible nodes, min_nodes is {record.min_nodes}",
        )
        return (
            waiting_record,
            [job_event("job_waiting", waiting_record, waiting_record.detail)],
            "waiting",
        )
    master = nodes[chosen[0]]
    running = record.moved_to(
        JobState.RUNNING,
        reason=reason,
        detail=detail,
        members=chosen,
        master_addr=master.address,
        master_port=master.free_port,
        restart_count=restart_count,
        pending_failure=None,
        since_ms=ctx.view.now_ms,
    )
    message = (
        f"generation {running.generation} started: world {running.world_size} on {names(chosen)}"
    )
    events = [job_event("generation_started", running, message)]
    if running.checkpoint is not None:
        tiers = restore.choose(running.checkpoint, chosen, record.nproc_per_node, nodes)
        zombies = bool(ctx.held)  # held out, alive: they may save on for a while
        running = replace(
            running, checkpoint=restore.rolled_back(tiers, running.generation, zombies)
        )
        events.append(restore_event(running, tiers))
    if running.reason == RestartReason.SCALE:
        applied = f"running on {len(chosen)} nodes (target {running.target_nodes})"
        events.append(job_event("scale_applied", running, applied))
    return running, events, "started"


def _step_waiting(record: JobRecord, ctx: _Context) -> _Step:
    count = len(ctx.eligible)
    if count >= record.min_nodes and (count >= record.target_nodes or _settled(ctx)):
        return _begin(record, ctx, RestartReason.NODE_JOINED)
    waited_ms = ctx.view.now_ms - record.since_ms
    if waited_ms > ctx.policy.rendezvous_timeout_ms:
        failed = record.moved_to(
            JobState.FAILED,
            reason="rendezvous_timeout",
            since_ms=ctx.view.now_ms,
            detail=f"only {count} of min_nodes={record.min_nodes} nodes "
            f"after {waited_ms / 1000:.0f}s",
        )
        return failed, [job_event("job_failed", failed, failed.detail)], "failed"
    return record, [], f"waiting for nodes: {count} eligible, min_nodes {record.min_nodes}"
