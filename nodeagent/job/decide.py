"""One agent's decisions about its own workers, as a pure function.

`decide(view)` looks at the job record (as last read from Redis) and the local worker group and
returns the node's next state and the actions to take: stop workers, acknowledge a generation,
start workers, leave. Only `Agent` executes them.

The two rules that keep generations apart:
- an agent acknowledges generation g only when none of its workers takes part in a process
  group (they have exited, or, in_place, every live one has reported leaving its own), and
  after that never starts a generation older than g;
- it starts workers of g only when the record says g is RUNNING with this node as a member,
  and only if this agent itself acknowledged g while it formed. An agent that first sees g
  already RUNNING with its node as a member is a new incarnation of a member whose workers
  are gone (killed by the fence keeper with its predecessor): its peers are inside g's
  collectives, and a rank that starts there afresh hangs them. It reports itself FENCED (its
  workers are out of g, as the fence keeper made them: the agent announces it, and the leader
  re-forms at once, not a lease later) and waits for g+1.
"""

from __future__ import annotations

from dataclasses import dataclass

from nodeagent.model.job import Cordon, JobRecord, RestartReason
from nodeagent.state import JobState, NodeState
from nodeagent.supervisor.status import GroupPhase, GroupStatus


@dataclass(frozen=True)
class LocalView:
    name: str
    acked_generation: int
    group: GroupStatus
    record: JobRecord | None
    shutting_down: bool = False
    fence: bool = False  # the lease could not be renewed in time
    fenced_generation: int | None = None  # set once fenced: wait for a newer generation
    cordon: Cordon | None = None  # this node's cordon, as last read from Redis
    unfit: str | None = None  # why this node cannot take part (too few usable GPUs)
    in_place: bool = False  # job.recovery: in_place (survivors are released, not stopped)
    warm_ups: bool = False  # JobConfig.warm_ups: a failed worker's replacement warms up at once
    # The checkpoint tiers are verifying (or persisting) the stopped workers' last saves: the
    # leader chooses the next restore from what this node reports, so it must not move on yet.
    tiers_settling: bool = False
    tiers_copying: bool = False  # the last generation's copies end (cancelled) first
    signalled: str = "0-0"  # the id of the last record signal this node's workers were sent


@dataclass(frozen=True)
class StopWorkers:
    reason: str
    fence: bool = False  # shorten the grace period so workers die before the lease expires
    broken: bool = False  # the generation failed: its collectives cannot complete


@dataclass(frozen=True)
class ReleaseWorkers:
    """in_place: tell the workers to leave their generation's process group; they keep running
    and wait for their next assignment (the group becomes PARKED)."""

    reason: str
    broken: bool = False  # the generation failed (else: a scale, a drain; their saves persist)


@dataclass(frozen=True)
class Acknowledge:
    generation: int


@dataclass(frozen=True)
class StartWorkers:
    record: JobRecord
    group_rank: int


@dataclass(frozen=True)
class Leave:
    pass


@dataclass(frozen=True)
class SignalWorkers:
    """Send `signal` (USR1) to every worker's main process, once per `id` (the record's)."""

    signal: str
    id: str


Action = StopWorkers | ReleaseWorkers | Acknowledge | StartWorkers | Leave | SignalWorkers


@dataclass(frozen=True)
class NodeDecision:
    state: NodeState
    actions: tuple[Action, ...]
    reason: str


def fenced_at(acked: int, group_generation: int, record: JobRecord | None) -> int:
    """The generation a node that fences itself stays out of: it waits for a newer one.

    Every generation its workers or its acknowledgement touched, and the record's when that one
    runs. A generation only announced (RESTARTING) is not yet running anywhere, and the leader
    waits for this node's acknowledgement of it (every live node's, the barrier): staying out of
    it too would hold the barrier forever, and with it the job, while the lease keeps this node
    live. It acknowledges the announced generation once its workers have stopped, as any node
    does (found in the suite: a leader that fenced itself under load right after announcing
    waited for its own acknowledgement, and the job never re-formed)."""
    seen = max(acked, group_generation)
    if record is None:
        return seen
    if record.state is JobState.RESTARTING:
        return max(seen, record.generation - 1)
    return max(seen, record.generation)


def decide(view: LocalView) -> NodeDecision:
    """The node's next state and actions. Pure."""
    group = view.group
    if view.shutting_down:
        if group.stoppable:
            return NodeDecision(NodeState.LEAVING, (StopWorkers("agent shutting down"),), "leaving")
        if group.active:
            return NodeDecision(NodeState.LEAVING, (), "waiting for workers to stop")
        if view.tiers_settling:
            return NodeDecision(NodeState.LEAVING, (), "persisting the last checkpoint")
        return NodeDecision(NodeState.LEAVING, (Leave(),), "workers stopped")
    if view.fence:
        stop = (StopWorkers("lease not renewed", fence=True),)
        return NodeDecision(NodeState.FENCED, stop if group.stoppable else (), "fenced")
    record = view.record
    fenced = view.fenced_generation
    if fenced is not None and (record is None or record.generation <= fenced):
        return NodeDecision(NodeState.FENCED, (), "fenced: waiting for a new generation")
    if record is None:
        if group.active or group.phase is GroupPhase.PARKED:
            # Redis lost the record: keep training until a leader re-forms the job.
            state = NodeState.RUNNING if group.phase is GroupPhase.RUNNING else NodeState.STOPPING
            return NodeDecision(state, (), "no job record in Redis; keeping workers")
        return NodeDecision(NodeState.JOINING, (), "no job record yet")
    draining = view.cordon is not None and view.cordon.drain
    if draining and group.stoppable:
        assert view.cordon is not None
        drain = StopWorkers(f"drained: {view.cordon.reason}")  # full grace: a checkpoint
        return NodeDecision(NodeState.DRAINING, (drain,), "drained")
    if draining and group.phase is GroupPhase.STOPPING:
        return NodeDecision(NodeState.DRAINING, (), "drained: workers stopping")
    if group.phase is GroupPhase.RUNNING:
        return _decide_running(view, record)
    if group.phase in (GroupPhase.STOPPING, GroupPhase.RELEASING):
        failed = group.failure is not None and group.generation == record.generation
        how = "stopping" if group.phase is GroupPhase.STOPPING else "leaving their generation"
        return NodeDecision(
            NodeState.FAILED if failed else NodeState.STOPPING, (), f"workers {how}"
        )
    return _decide_idle(view, record)


def _decide_running(view: LocalView, record: JobRecord) -> NodeDecision:
    group = view.group
    if group.failure is not None:
        if view.in_place:  # the survivors of this node keep running too
            release = ReleaseWorkers(
                f"a local worker failed: {group.failure.describe()}", broken=True
            )
            return NodeDecision(NodeState.FAILED, (release,), group.failure.describe())
        stop = StopWorkers("a local worker failed", broken=True)
        return NodeDecision(NodeState.FAILED, (stop,), group.failure.describe())
    broken = False
    if _gone_back(record, group):
        # Redis lost what runs (a restart without persistence, a failover to a replica that
        # lacked the last writes): never act on its past. The leader writes it back (resume.py).
        old = f"the record is of generation {record.generation} {record.state.value}"
        return NodeDecision(NodeState.RUNNING, (), f"{old}, older than its workers': kept")
    if record.generation != group.generation:
        reason = f"generation {record.generation} replaces {group.generation} ({record.reason})"
        why = RestartReason.of(record.reason)
        broken = why is not None and why.breaks_generation
        if view.in_place:
            release = ReleaseWorkers(reason, broken=broken)
            return NodeDecision(NodeState.STOPPING, (release,), reason)
    elif record.state is not JobState.RUNNING:
        reason = f"job is {record.state.value}"
    elif view.name not in record.members:
        reason = "no longer a member"
    else:
        return NodeDecision(NodeState.RUNNING, _signal(view, record), "running")
    return NodeDecision(NodeState.STOPPING, (StopWorkers(reason, broken=broken),), reason)


def _gone_back(record: JobRecord, group: GroupStatus) -> bool:
    """The record is older than the generation this node's workers run: a lower generation,
    or theirs not yet running (every generation is announced, RESTARTING, with a new number,
    and a record never goes back to it)."""
    generation = group.generation or 0
    return record.generation < generation or (
        record.generation == generation and record.state in (JobState.RESTARTING, JobState.WAITING)
    )


def _signal(view: LocalView, record: JobRecord) -> tuple[Action, ...]:
    """The record's signal, if this node's running workers of its generation have not had it."""
    if not record.signal or record.signal_id == view.signalled:
        return ()
    if record.signal_generation != view.group.generation:
        return ()
    return (SignalWorkers(record.signal, record.signal_id),)


def _under_way_without_me(view: LocalView, record: JobRecord) -> bool:
    """`record`'s generation runs with this node as a member, and this agent never acknowledged
    it: it formed under this node's previous agent (the module docstring)."""
    return (
        record.state is JobState.RUNNING
        and view.acked_generation < record.generation
        and view.group.generation != record.generation
        and record.group_rank(view.name) is not None
    )


def _rejoins(group: GroupStatus, record: JobRecord) -> bool:
    """Parked workers left out of `record`'s generation are kept for the next: while a warm-up
    of theirs is starting (the job went on without this node: job/members.ready), or while
    the job has fewer members than its target (it takes a ready node back at once)."""
    return group.warming > 0 or len(record.members) < record.target_nodes


def _decide_idle(view: LocalView, record: JobRecord) -> NodeDecision:
    group = view.group
    actions: list[Action] = []
    acked = view.acked_generation
    if record.generation < acked:
        # Redis went back in time (a failover to a lagging replica, a restore): never act on it.
        return NodeDecision(NodeState.READY, (), f"record generation {record.generation} < {acked}")
    if record.generation > acked and view.tiers_settling:
        return NodeDecision(
            NodeState.READY, (), f"checkpoint tiers settling before generation {record.generation}"
        )
    fresh = _under_way_without_me(view, record)
    if record.generation > acked and not fresh:
        actions.append(Acknowledge(record.generation))
        acked = record.generation
    this_generation = group.generation == record.generation
    if this_generation and group.succeeded:
        return NodeDecision(NodeState.SUCCEEDED, tuple(actions), "workers succeeded")
    if this_generation and group.failure is not None:
        taking_part = view.cordon is None and view.unfit is None
        if (
            view.warm_ups
            and taking_part
            and group.phase is GroupPhase.EXITED
            and not group.released
        ):
            # Every local worker is gone: released all the same, so that the failed ones'
            # replacements warm up now (supervisor/group.py), not when the job has re-formed.
            why = f"a local worker failed: {group.failure.describe()}"
            actions.append(ReleaseWorkers(why, broken=True))
        return NodeDecision(NodeState.FAILED, tuple(actions), group.failure.describe())
    parked = group.phase is GroupPhase.PARKED  # in_place survivors waiting for an assignment
    if view.cordon is not None or view.unfit is not None:
        why = f"cordoned: {view.cordon.reason}" if view.cordon else f"unfit: {view.unfit}"
        if parked:
            actions.append(StopWorkers(why))
        return NodeDecision(NodeState.CORDONED, tuple(actions), why)
    if fresh:
        return NodeDecision(
            NodeState.FENCED,
            tuple(actions),
            f"generation {record.generation} was running before this agent started: its "
            "workers here are gone; waiting for the next generation",
        )
    rank = record.group_rank(view.name)
    if record.state is JobState.RUNNING and rank is None:
        if parked and not _rejoins(group, record):
            actions.append(StopWorkers(f"not a member of generation {record.generation}"))
        why = f"standby: {group.warming} workers warming up" if group.warming else "standby"
        return NodeDecision(NodeState.STANDBY, tuple(actions), why)
    if record.state is JobState.RUNNING and rank is not None and not this_generation:
        if view.tiers_copying:
            return NodeDecision(NodeState.READY, tuple(actions), "ending the copies under way")
        actions.append(StartWorkers(record, rank))
        return NodeDecision(NodeState.READY, tuple(actions), "starting workers")
    if parked and record.state.terminal:
        actions.append(StopWorkers(f"job is {record.state.value}"))
    return NodeDecision(NodeState.READY, tuple(actions), f"job is {record.state.value}")
